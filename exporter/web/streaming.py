"""A prepared body written to a client in slices of the one shared buffer.

The /metrics body (and the landing page's JSON) is built once per cycle and served to every
scraper. Handed to aiohttp whole, each response that the client does not read copied what
the socket did not take into its transport's buffer: 400 clients that never read a 225 kB
body held 200 MiB, 500 of a node's 4.6 MB body 3.2 GiB (issue 41). Written here in slices of
`CHUNK` bytes, each after the transport drained below its high-water mark, a stalled client
holds at most that mark and a slice or two (180 KiB measured, tests/test_hostile_clients.py),
`--web.max-connections` (512) of them at most 100 MiB, and nothing of the body is copied
per response beyond that. A client that reads nothing for
the write timeout is closed by the server (web/server.py); the write it stalled ends then.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

CHUNK = 64 * 1024


async def send(request: web.Request, body: bytes, headers: Mapping[str, str]) -> web.StreamResponse:
    """`body` with `headers` (Content-Type and the like), written a slice at a time."""
    if len(body) <= CHUNK:
        return web.Response(body=body, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    try:
        for start in range(0, len(body), CHUNK):
            await response.write(view[start : start + CHUNK])
        await response.write_eof()
    except ConnectionError:
        pass  # the client went, or was closed for not reading: nothing left to say to it
    return response
