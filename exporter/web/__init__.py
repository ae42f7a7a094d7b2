"""The HTTP side: the aiohttp app (`app`: /metrics bytes, probes, the landing page), the
server around it (`server`: timeouts, connection cap, TLS; `stats`: what it counts and logs),
basic auth and headers (`auth`, `basicauth`) and `--web.config.file` (`config`). It reads
snapshots and prepared bodies; it never reaches a source or the kubelet."""
