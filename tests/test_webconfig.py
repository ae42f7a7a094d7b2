"""--web.config.file (issue 14, item 6): TLS, client certificates, basic auth, headers, reload.

Certificates are made by the openssl command line for each test session; the server is the
real exporter on loopback, the client aiohttp with a real ssl context.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.app import Exporter
from exporter.cli.parser import UsageError
from exporter.web.config import WebConfigError, parse_web_config
from tests.support import StaticSource
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import gpu_result
from tests.support.web_clients import PASSWORD, basic, client_ssl, get, openssl

pytestmark = pytest.mark.peer

HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client", "renewed"):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)  # fmt: skip
    return d


def write_config(pki: Path, **extra: object) -> Path:
    doc: dict[str, object] = {
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "basic_auth_users": {"prometheus": HASH},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    doc.update(extra)
    path = pki / "web-config.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
async def secured(tmp_path: Path, pki: Path) -> AsyncIterator[Exporter]:
    config = config_for(tmp_path / "none.sock", "--web.config.file", str(write_config(pki)))
    exp = Exporter(config, sources={"fake": StaticSource(gpu_result())})
    await exp.start()
    await exp.wait_ready(10)
    try:
        yield exp
    finally:
        await exp.stop()


async def test_credentials_decide_and_probes_stay_open(secured: Exporter, pki: Path) -> None:
    assert secured.url.startswith("https://127.0.0.1:")
    ctx = client_ssl(pki)
    status, headers, _ = await get(f"{secured.url}metrics", ctx)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert (await get(f"{secured.url}metrics", ctx, basic("prometheus", "wrong")))[0] == 401
    assert (await get(f"{secured.url}api/devices", ctx, basic("nobody", PASSWORD)))[0] == 401
    status, headers, body = await get(f"{secured.url}metrics", ctx, basic("prometheus", PASSWORD))
    assert status == 200 and b"hw_gpu_utilization_ratio" in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    for probe in ("healthz", "readyz"):
        assert (await get(f"{secured.url}{probe}", ctx))[0] == 200
    assert secured.web_stats.unauthorized == 3


async def test_plain_http_is_refused(secured: Exporter) -> None:
    plain = secured.url.replace("https://", "http://")
    with pytest.raises(aiohttp.ClientError):
        await get(f"{plain}metrics", None, basic("prometheus", PASSWORD))
    assert secured.web_stats.closed["tls_handshake"] >= 1
    reader, writer = await asyncio.open_connection("127.0.0.1", secured.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200" not in await asyncio.wait_for(reader.read(), 5)
    writer.close()
    await asyncio.sleep(0.2)
    assert secured.web_stats.open == 0, "failed handshakes must not hold a place under the cap"


async def test_a_changed_file_is_used_without_a_restart(secured: Exporter, pki: Path) -> None:
    ctx = client_ssl(pki)
    other = bcrypt.hashpw(b"rotated", bcrypt.gensalt(rounds=4)).decode()
    write_config(pki, basic_auth_users={"prometheus": other})
    await asyncio.sleep(1.2)  # the watcher looks at most once a second
    assert (await get(f"{secured.url}metrics", ctx, basic("prometheus", PASSWORD)))[0] == 401
    assert (await get(f"{secured.url}metrics", ctx, basic("prometheus", "rotated")))[0] == 200
    (pki / "web-config.yml").write_text("tls_server_config: [broken\n")
    await asyncio.sleep(1.2)
    assert (await get(f"{secured.url}metrics", ctx, basic("prometheus", "rotated")))[0] == 200, (
        "a broken file keeps the last good config"
    )
    assert secured.web_stats.watcher is not None
    assert dict(secured.web_stats.watcher.reloads) == {"success": 1, "failure": 1}
    write_config(pki)  # the module's other tests expect the original


async def peer_certificate(exp: Exporter, pki: Path) -> bytes:
    _, writer = await asyncio.open_connection("127.0.0.1", exp.port, ssl=client_ssl(pki))
    ssl_object = writer.get_extra_info("ssl_object")
    cert = ssl_object.getpeercert(binary_form=True)
    writer.close()
    return bytes(cert)


async def test_a_renewed_certificate_is_served_without_a_restart(
    secured: Exporter, pki: Path
) -> None:
    before = await peer_certificate(secured, pki)
    original = {n: (pki / n).read_bytes() for n in ("server.crt", "server.key")}
    try:
        # as cert-manager renews it: the same file names, new content
        (pki / "server.key").write_bytes((pki / "renewed.key").read_bytes())
        (pki / "server.crt").write_bytes((pki / "renewed.crt").read_bytes())
        await asyncio.sleep(1.2)
        after = await peer_certificate(secured, pki)
        assert after != before and after == ssl.PEM_cert_to_DER_cert(
            (pki / "renewed.crt").read_text()
        )
    finally:
        for name, data in original.items():
            (pki / name).write_bytes(data)


async def test_client_certificates_when_required(tmp_path: Path, pki: Path) -> None:
    tls = {
        "cert_file": "server.crt",
        "key_file": "server.key",
        "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": "ca.crt",
        "min_version": "TLS13",
    }
    path = write_config(pki, tls_server_config=tls, basic_auth_users={})
    exp = Exporter(config_for(tmp_path / "none.sock", "--web.config.file", str(path)),
                   sources={"fake": StaticSource(gpu_result())})  # fmt: skip
    await exp.start()
    try:
        await exp.wait_ready(10)
        with pytest.raises(aiohttp.ClientError):
            await get(f"{exp.url}metrics", client_ssl(pki))
        assert (await get(f"{exp.url}metrics", client_ssl(pki, cert=True)))[0] == 200
        old = client_ssl(pki, cert=True)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(aiohttp.ClientError):
            await get(f"{exp.url}metrics", old)
    finally:
        await exp.stop()
        write_config(pki)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "server.crt"}}, "cert_file and key_file"),
        ({"basic_auth_users": {"u": "plaintext"}}, "bcrypt"),
        ({"tls_server_config": {"cipher_suites": ["X"]}}, "cipher_suites"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}}, "min_version"),
        ({"http_server_config": {"headers": {"X-Powered-By": "me"}}}, "X-Powered-By"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "not allowed"),
        ({"basic_auth": {}}, "unknown key 'basic_auth'"),
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "No such file"),
        ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                                "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_key(pki: Path, doc: dict[str, object], message: str) -> None:
    with pytest.raises(WebConfigError, match=message):
        parse_web_config(yaml.safe_dump(doc), pki)


def test_a_bad_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: {u: nothashed}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--web.config.file", str(bad)],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--web.config.file" in proc.stderr
    with pytest.raises(UsageError, match="cannot read"):
        config_for(tmp_path / "k.sock", "--web.config.file", str(tmp_path / "absent.yml"))


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=3)
    ),
    max_leaves=10,
)
keys = st.sampled_from(["tls_server_config", "http_server_config", "basic_auth_users", "x"])


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80), st.dictionaries(keys, yaml_values, max_size=3).map(yaml.safe_dump)
    )
)
def test_any_file_parses_or_raises_web_config_error(text: str) -> None:
    with contextlib.suppress(WebConfigError):
        parse_web_config(text, Path("/nonexistent"))
