"""A web config that becomes empty, unreadable, invalid, removed, or that would turn TLS or
basic auth off, keeps the last good one, loudly (issue 25, item 2); SIGHUP reloads it
(item 8). The real exporter on loopback, a real TLS client."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from simulator.ports import free_port
from tests.support import StaticSource
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import gpu_result
from tests.support.web_clients import PASSWORD, basic, client_ssl, get, openssl

pytestmark = pytest.mark.peer

GOOD = {
    "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
    "basic_auth_users": {
        "prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    },
}
LAST_OK = "kube_device_exporter_web_config_last_reload_successful"


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1, in a directory of this test's own."""
    d = tmp_path / "pki"
    d.mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server", cwd=d)  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=d)  # fmt: skip
    (d / "web.yml").write_text(yaml.safe_dump(GOOD))
    return d


@pytest.fixture
async def secured(tmp_path: Path, pki: Path) -> AsyncIterator[Exporter]:
    config = config_for(tmp_path / "none.sock", "--web.config.file", str(pki / "web.yml"))
    exp = Exporter(config, sources={"fake": StaticSource(gpu_result())})
    await exp.start()
    await exp.wait_ready(10)
    try:
        yield exp
    finally:
        await exp.stop()


async def still_secured(exp: Exporter, pki: Path) -> str:
    """TLS and auth as before: plain HTTP fails, no credentials 401, good ones 200; the
    /metrics text."""
    ctx = client_ssl(pki)
    plain = exp.url.replace("https://", "http://")
    with pytest.raises(aiohttp.ClientError):
        await get(f"{plain}metrics", None, basic("prometheus", PASSWORD))
    assert (await get(f"{exp.url}metrics", ctx))[0] == 401
    status, _, body = await get(f"{exp.url}metrics", ctx, basic("prometheus", PASSWORD))
    assert status == 200
    return body.decode()


def gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} not in /metrics")


async def changed(path: Path, change: str) -> None:
    """Make the change, then wait past the watcher's once-a-second look."""
    if change == "empty":
        path.write_text("")
    elif change == "comments only":
        path.write_text("# being rewritten\n")
    elif change == "removed":
        path.unlink()
    elif change == "unreadable":
        path.unlink()
        path.mkdir()  # root reads any file: a directory is what cannot be read
    elif change == "invalid":
        path.write_text("tls_server_config: [broken\n")
    elif change == "no tls":
        path.write_text(yaml.safe_dump({"basic_auth_users": GOOD["basic_auth_users"]}))
    elif change == "no auth":
        path.write_text(yaml.safe_dump({"tls_server_config": GOOD["tls_server_config"]}))
    elif change == "neither":
        path.write_text(yaml.safe_dump({"http_server_config": {"headers": {}}}))
    await asyncio.sleep(1.2)


@pytest.mark.parametrize(
    "change",
    ["empty", "comments only", "removed", "unreadable", "invalid", "no tls", "no auth", "neither"],
)
async def test_a_bad_reload_keeps_tls_and_auth_loudly(
    secured: Exporter, pki: Path, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = pki / "web.yml"
    assert gauge(await still_secured(secured, pki), LAST_OK) == 1.0
    with caplog.at_level(logging.WARNING, logger="exporter.webconfig"):
        await changed(path, change)
        text = await still_secured(secured, pki)
        await asyncio.sleep(0.3)  # the self-metric is the next cycle's
        text = await still_secured(secured, pki)
    assert gauge(text, LAST_OK) == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "keeping the last good" in warnings[0], warnings
    assert secured.web_stats.watcher is not None
    assert secured.web_stats.watcher.reloads["failure"] == 1
    # A good file again: used, and said.
    if path.is_dir():
        path.rmdir()
    path.write_text(yaml.safe_dump(GOOD))
    await asyncio.sleep(1.2)
    await still_secured(secured, pki)
    await asyncio.sleep(0.3)
    assert gauge(await still_secured(secured, pki), LAST_OK) == 1.0


async def test_removed_then_emptied_keeps_the_last_good(secured: Exporter, pki: Path) -> None:
    """The issue's sequence: truncated to 0 bytes, then deleted; TLS and auth throughout."""
    path = pki / "web.yml"
    await changed(path, "empty")
    await still_secured(secured, pki)
    await changed(path, "removed")
    await still_secured(secured, pki)


def test_sighup_reloads_the_web_config(tmp_path: Path) -> None:
    """A process with --web.config.file: HUP re-reads it now (logged), a bad file on HUP is
    refused the same way, and the process lives on."""
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": GOOD["basic_auth_users"]}))
    log = tmp_path / "exporter.log"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--kubelet-socket", str(tmp_path / "none.sock"),
             "--no-collector.nvml", "--path.sysfs", str(tmp_path), "--web.listen-address",
             f"127.0.0.1:{port}", "--web.config.file", str(path)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while "serving on" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGHUP)
        while "reloaded on SIGHUP" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        path.write_text("")
        proc.send_signal(signal.SIGHUP)
        while "not reloaded on SIGHUP" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert proc.returncode == 0


def test_no_stray_files(tmp_path: Path) -> None:
    """The fixtures write only under the test's own directory."""
    assert not (Path.cwd() / "web.yml").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert not os.path.exists(tmp_path)
