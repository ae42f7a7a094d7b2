"""Real peers for the suite: a Prometheus server, promtool and headless Chromium.

They come from Debian packages that `make install` installs when run as root; a missing
binary fails the test with that instruction (a peer test never silently passes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.ports import free_port


def need(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} not found: install the Debian package {package!r} (make install)")
    return path


class PrometheusServer:
    """A real Prometheus scraping `targets` every `scrape_interval`, with optional rules."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        scrape_config: dict[str, Any] | None = None,
    ) -> None:
        self.binary = need("prometheus", "prometheus")
        self.workdir = workdir
        self.port = free_port()
        job: dict[str, Any] = {
            "job_name": "kube-device-exporter",
            "static_configs": [{"targets": list(targets)}],
            **(scrape_config or {}),
        }
        config = {
            "global": {
                "scrape_interval": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [job],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.api("query", query=promql)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(
        self,
        promql: str,
        check: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Poll a query until `check(result)` holds; fail with the last result."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if check(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting on {promql!r}; last result: {result}")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = need("promtool", "prometheus")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False)


def promtool_check_metrics(text: str, lint: Sequence[str] = ()) -> None:
    """`promtool check metrics` on a whole /metrics output; fails with promtool's words.

    `lint`: the exact set of lint problems expected (promtool exits 3 for lint problems
    only, one line per problem and series); any other problem, or a parse error, fails."""
    done = subprocess.run(
        [need("promtool", "prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if not lint:
        assert done.returncode == 0, done.stdout + done.stderr
        return
    problems = {line for line in (done.stdout + done.stderr).splitlines() if line}
    assert (done.returncode, problems) == (3, set(lint)), done.stdout + done.stderr


def chromium(url: str, *, screenshot: Path | None = None, budget_ms: int = 8000) -> str:
    """Load `url` in real headless Chromium, let its scripts run, return the DOM."""
    binary = shutil.which("chromium") or need("chromium", "chromium")
    with tempfile.TemporaryDirectory() as profile:
        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
        ]
        if screenshot is not None:
            done = subprocess.run(
                [*args, "--window-size=1280,800", f"--screenshot={screenshot}", url],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert screenshot.exists(), done.stderr[-2000:]
        done = subprocess.run(
            [*args, "--dump-dom", url], capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@dataclass
class ScrapedSimulation:
    prometheus: PrometheusServer
    stop_seconds: float = 0.0
    """How long the exporter took to exit after SIGTERM (set when the context ends)."""


@contextlib.contextmanager
def scraped_simulation(
    tmp: Path, scenario: Path, *extra: str, rule_files: Sequence[Path] = ()
) -> Iterator[ScrapedSimulation]:
    """`kde-simulate SCENARIO` in a process session of its own, collecting every 1 s, scraped
    every 1 s by a real Prometheus (`prometheus.started`: the exporter's start, monotonic).
    On exit: SIGTERM, the exporter's log tail printed."""
    port = free_port()
    with (tmp / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "simulator", str(scenario),
             "--web.listen-address", f"127.0.0.1:{port}", "--collect-interval", "1s", *extra],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    started = time.monotonic()
    prom = PrometheusServer(tmp, [f"127.0.0.1:{port}"], scrape_interval="1s", rule_files=rule_files)
    prom.start()
    run = ScrapedSimulation(prom)
    try:
        prom.wait_for('up{job="kube-device-exporter"} == 1', timeout=30)
        prom.started = started  # type: ignore[attr-defined]
        yield run
    finally:
        prom.stop()
        os.killpg(proc.pid, signal.SIGTERM)
        stopping = time.monotonic()
        proc.wait(timeout=20)
        run.stop_seconds = time.monotonic() - stopping
        print((tmp / "exporter.log").read_text()[-3000:])
