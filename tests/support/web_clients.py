"""Clients of an exporter behind --web.config.file: the openssl command line that makes the
test certificates, an SSL context trusting their CA (with the client certificate if asked),
a basic-auth header, one GET; PASSWORD is the users' password in the tests' web configs."""

from __future__ import annotations

import base64
import ssl
import subprocess
from pathlib import Path

import aiohttp

PASSWORD = "s3cret"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def client_ssl(pki: Path, *, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki / "client.crt", pki / "client.key")
    return ctx


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def get(
    url: str, ctx: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url, ssl=ctx if ctx is not None else False, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()
