"""The exporter as users run it: `python -m exporter` in a process of its own, against a
real kubelet's PodResources socket, the NVML stand-in loaded through LD_LIBRARY_PATH, the
host's /proc and the kubelet's container-log folder; scraped over HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from simulator.ports import free_port


@dataclass(frozen=True)
class Series:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str) -> list[Series]:
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.append(Series(sample.name, dict(sample.labels), sample.value))
    return out


class ExporterProcess:
    def __init__(
        self,
        socket: Path,
        node: str,
        workdir: Path,
        *,
        env: Mapping[str, str],
        flags: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.log_path = workdir / "exporter.log"
        self.argv = [
            sys.executable, "-m", "exporter", "--kubelet-socket", str(socket),
            "--node-name", node, "--web.listen-address", f"127.0.0.1:{self.port}", *flags,
        ]  # fmt: skip
        self.env = {**os.environ, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self, timeout: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the exporter exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if "kube_device_exporter_cycles_total" in self.scrape_text():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"no /metrics within {timeout} s:\n{self.log_tail()}")

    def scrape_text(self) -> str:
        with urllib.request.urlopen(self.url, timeout=5) as response:
            return str(response.read().decode())

    def scrape(self) -> list[Series]:
        return parse(self.scrape_text())

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def series(samples: Sequence[Series], name: str, **labels: str) -> list[Series]:
    """Samples called `name` whose labels include `labels`."""
    return [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


class Scraper:
    """Scrapes `exporter` every `every` seconds in a thread while a test acts (restarts a
    kubelet, stops a plugin); `results` holds (monotonic time, samples) of each scrape,
    `errors` the scrapes that failed."""

    def __init__(self, exporter: ExporterProcess, every: float = 0.2) -> None:
        self.exporter = exporter
        self.every = every
        self.results: list[tuple[float, list[Series]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                self.results.append((at, self.exporter.scrape()))
            except OSError as exc:
                self.errors.append(f"{at:.3f}: {exc}")
            self._stop.wait(max(0.0, self.every - (time.monotonic() - at)))
