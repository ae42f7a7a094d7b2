"""Faults of host reads, the web config and password floods (issue 25), against real
exporter processes: stuck host reads, a web config emptied or removed, a password flood,
user-name timing, a planted sysfs link, a pod listed three times, SIGHUP, a node of 100,000
device IDs and a List over the size cap (bench/bignode.py). `python -m bench.faults` runs
them after its own; alone:

    python -m bench.host_and_web_faults [--tree DIR]

`--tree DIR` runs the exporter processes from another checkout of the code (its `exporter`
package, this script's harness): the figures "before" in docs/reliability.md come from the
commit before issue 25's fixes, run this way.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import bcrypt
import yaml

from bench.bignode import fault_rows
from bench.fault_harness import Process, Row, print_table, read_metrics, value
from simulator.node import SimulatedNode
from simulator.scenario import parse_scenario
from tests.support.waiting import within

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000007"
AMD = "0000:03:00.0"
NODE = f"""
node: round3
allocatable:
  - {{resource: nvidia.com/gpu, ids: ["{GPU}"]}}
  - {{resource: amd.com/gpu, ids: ["{AMD}"]}}
pods:
  - name: alpha
    namespace: team-a
    containers:
      - name: train
        pids: [1001, 1002, 1003, 1004]
        devices: [{{resource: nvidia.com/gpu, ids: ["{GPU}"]}}]
procfs: {{cgroup: v2, driver: systemd, runtime: containerd, cgroupns: false, host_processes: [900]}}
nvidia:
  pid_namespace: host
  gpus:
    - uuid: {GPU}
      processes:
        - {{pid: 1001, memory: 1GiB}}
        - {{pid: 1002, memory: 1GiB}}
        - {{pid: 1003, memory: 1GiB}}
        - {{pid: 1004, memory: 1GiB}}
        - {{pid: 900, memory: 1GiB}}
sysfs:
  amdgpu:
    - {{pci: "{AMD}", card: 1, busy_percent: 37, vram_gib: 64, unique_id: 00ab, product: MI210}}
"""
AMD_DEV = "devices/pci0000:00/0000:00:03.0/0000:03:00.0"
SECRET = "TOP-SECRET-first-line"
STUCK_SITE = Path(__file__).resolve().parent.parent / "tests" / "stuck_reads_site"


def _seconds(took: float | None, otherwise: str) -> str:
    return f"in {took:.1f} s" if took is not None else otherwise


def _exit(took: float | None, limit: float = 30.0) -> str:
    return f"{took:.2f} s" if took is not None else f"still running after {limit:g} s (SIGKILL)"


async def _ready(http: aiohttp.ClientSession, p: Process, timeout: float = 20.0) -> float | None:
    async def ok() -> bool:
        return bool(await read_metrics(http, p.url))

    return await within(ok, timeout)


async def stuck_reads(tree: Path, work: Path) -> list[Row]:
    """A FIFO, an oversized stat and a non-ASCII start time in the fixture /proc; then reads
    that sleep (a hung mount) in /proc/1001/stat and the NUMA map's cpulist."""
    rows = []
    for case in ("fifo", "sleep"):
        node = SimulatedNode(parse_scenario(NODE, name="round3"), work / case)
        await node.start()
        node.advance()
        proc, env = node.workdir / "proc", dict(node.env())
        cpulist = node.workdir / "sysfs" / "devices" / "system" / "node" / "node0" / "cpulist"
        if case == "fifo":
            (proc / "1002" / "stat").unlink()
            os.mkfifo(proc / "1002" / "stat")
            (proc / "1003" / "stat").write_text("1003 (" + "x" * 8000 + ") S" + " 1" * 50 + "\n")
            (proc / "1004" / "stat").write_text("1004 (p) S" + " 1" * 18 + " ²³ 0 0\n")
        else:
            cpulist.parent.mkdir(parents=True, exist_ok=True)
            cpulist.write_text("0-3\n")
            env["PYTHONPATH"] = os.pathsep.join([str(STUCK_SITE), str(STUCK_SITE.parent.parent)])
            env["KDE_TEST_STUCK_READS"] = os.pathsep.join(
                [str(proc / "1001" / "stat"), str(cpulist)]
            )
        p = Process(
            tree, work / f"{case}.log", [*node.exporter_args(), "--collect-interval", "1s"], env
        )
        try:
            async with aiohttp.ClientSession() as http:
                ready = await _ready(http, p)
                m = await read_metrics(http, p.url)
            groups = {
                labels.get("k8s_pod_name", "") or "no pod": v
                for labels, v in m.get("hw_gpu_container_processes", [])
            }
            enabled = value(m, "kube_device_exporter_attribution_enabled")
            took = p.sigterm()
        finally:
            p.kill()
            await node.stop()
            for part in node.parts:
                part.close()
        what = (
            "a FIFO at /proc/1002/stat, an 8 KB /proc/1003/stat, a start time of '²³' in "
            "/proc/1004/stat"
            if case == "fifo"
            else "reads of /proc/1001/stat and node0/cpulist that never return (a hung mount)"
        )
        rows.append(
            Row(
                what,
                f"ready {_seconds(ready, 'NEVER (20 s)')}; processes per group {groups or 'none'}; "
                f"attribution_enabled {enabled}; SIGTERM to exit {_exit(took)}",
                "n/a",
            )
        )
    return rows


def _pki(d: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=bench-ca")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2",
            "-extfile", "san.ext")  # fmt: skip


def _basic(user: str, password: bytes) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user.encode() + b":" + password).decode()}


BARE = ["--kubelet-socket", "/nonexistent/kubelet.sock", "--no-collector.nvml"]


def _one_user_exporter(tree: Path, work: Path, name: str, cost: int) -> Process:
    """An exporter whose web config (work/NAME.yml) has one user, prometheus:pw, hashed at
    bcrypt `cost`; its log is work/NAME.log."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(cost)).decode()
    path = work / f"{name}.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    return Process(
        tree,
        work / f"{name}.log",
        [*BARE, "--path.sysfs", str(work), "--web.config.file", str(path)],
        {},
    )


async def web_config_emptied(tree: Path, work: Path) -> Row:
    """TLS and basic auth on; the file truncated to 0 bytes, then deleted."""
    d = work / "web"
    d.mkdir()
    _pki(d)
    good = {
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "basic_auth_users": {"prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()},
    }
    path = d / "web.yml"
    path.write_text(yaml.safe_dump(good))
    p = Process(
        tree,
        work / "web.log",
        [
            *BARE,
            "--path.sysfs",
            str(work),
            "--web.config.file",
            str(path),
            "--collect-interval",
            "1s",
        ],
        {},
    )
    import ssl

    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    https, plain = f"https://127.0.0.1:{p.port}/metrics", f"http://127.0.0.1:{p.port}/metrics"

    async def status(http: aiohttp.ClientSession, url: str, **kw: object) -> str:
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=5), **kw) as r:  # type: ignore[arg-type]
                return str(r.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__

    try:
        async with aiohttp.ClientSession() as http:

            async def served() -> bool:
                auth = _basic("prometheus", b"pw")
                return await status(http, https, ssl=ctx, headers=auth) == "200"

            if await within(served, 20) is None:
                raise RuntimeError(f"exporter not serving over HTTPS: {p.log()}")
            seen = [f"before: plain HTTP {await status(http, plain)}"]
            for step in ("emptied", "deleted"):
                if step == "emptied":
                    path.write_text("")
                else:
                    path.unlink()
                await asyncio.sleep(1.5)
                seen.append(
                    f"{step}: plain HTTP {await status(http, plain)}, HTTPS without credentials "
                    f"{await status(http, https, ssl=ctx)}"
                )
            await asyncio.sleep(1.2)  # self-metrics are the next cycle's
            m = await read_metrics_tls(http, https, ctx)
            gauge = value(m, "kube_device_exporter_web_config_last_reload_successful")
            failures = value(m, "kube_device_exporter_web_config_reloads_total", result="failure")
        warned = sum("keeping the last good" in line for line in p.log().splitlines())
    finally:
        p.kill()
    return Row(
        "--web.config.file with TLS and basic auth truncated to 0 bytes, then deleted",
        "; ".join(seen) + f"; last_reload_successful {gauge}, reload failures {failures}, "
        f"{warned} warning line(s)",
        "n/a (the last good config stays in use)",
    )


async def read_metrics_tls(
    http: aiohttp.ClientSession, url: str, ctx: object
) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with http.get(url, ssl=ctx, headers=_basic("prometheus", b"pw")) as r:  # type: ignore[arg-type]
            text = await r.text()
    except aiohttp.ClientError:
        return {}
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def password_flood(tree: Path, work: Path, clients: int, seconds: float) -> Row:
    """A cost-10 user; `clients` guessers on 127.0.0.2 and up, each as fast as answered; the
    real scraper (already authenticated once) scrapes every 0.5 s with a 10 s timeout."""
    p = _one_user_exporter(tree, work, "auth", cost=10)
    stop = asyncio.Event()
    sent = 0

    async def guesser(n: int) -> None:
        """Every guess a new password (a repeated one would be cached: no bcrypt)."""
        nonlocal sent
        connector = aiohttp.TCPConnector(local_addr=(f"127.0.{n // 250}.{n % 250 + 2}", 0))
        async with aiohttp.ClientSession(connector=connector) as http:
            while not stop.is_set():
                try:
                    async with http.get(
                        f"{p.url}/metrics",
                        headers=_basic("prometheus", f"g{n}-{sent}".encode()),
                        timeout=aiohttp.ClientTimeout(total=30),
                    ) as r:
                        await r.read()
                except (aiohttp.ClientError, TimeoutError):
                    await asyncio.sleep(0.05)
                sent += 1

    try:
        async with aiohttp.ClientSession() as http:
            right = _basic("prometheus", b"pw")

            async def authed() -> bool:
                try:
                    async with http.get(f"{p.url}/metrics", headers=right) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await within(authed, 20)
            guessing = [asyncio.ensure_future(guesser(n)) for n in range(clients)]
            await asyncio.sleep(2.0)
            latencies, timeouts = await timed_scrapes(http, f"{p.url}/metrics", right, seconds)
            stop.set()
            await asyncio.gather(*guessing)
            m = await read_metrics_authed(http, f"{p.url}/metrics", right)
    finally:
        p.kill()
    rejected = {
        r: value(m, "kube_device_exporter_http_requests_rejected_total", reason=r)
        for r in ("unauthorized", "rate_limited")
    }
    lat = sorted(latencies)
    p50 = statistics.median(lat) * 1000 if lat else float("nan")
    worst = lat[-1] * 1000 if lat else float("nan")
    return Row(
        f"password flood: {clients} clients guessing for {seconds:g} s while the real scraper "
        "scrapes every 0.5 s",
        f"{sent} guesses; real scrapes: {len(latencies)} answered (p50 {p50:.0f} ms, slowest "
        f"{worst:.0f} ms), {timeouts} failed or timed out at 10 s; rejected {rejected}",
        "n/a",
    )


async def timed_scrapes(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], seconds: float
) -> tuple[list[float], int]:
    """A scrape every 0.5 s for `seconds`, 10 s timeout: the answered ones' latencies, and
    how many failed or timed out."""
    latencies: list[float] = []
    failed = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.monotonic()
        try:
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(10)) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok:
            latencies.append(time.monotonic() - t0)
        else:
            failed += 1
        await asyncio.sleep(0.5)
    return latencies, failed


async def read_metrics_authed(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(url, headers=headers) as r:
        text = await r.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def user_name_timing(tree: Path, work: Path) -> Row:
    """A cost-12 user: a wrong password for it and any password for an unknown name, timed
    over HTTP, each from its own client address (no rate limit in the way)."""
    p = _one_user_exporter(tree, work, "timing", cost=12)
    took: dict[str, list[float]] = {"prometheus": [], "nobody": []}
    try:
        async with aiohttp.ClientSession() as http:
            await within(lambda: _status_ok(http, f"{p.url}/healthz"), 20)
            for i in range(8):
                for user in ("prometheus", "nobody"):
                    connector = aiohttp.TCPConnector(
                        local_addr=(f"127.0.9.{i * 2 + (user == 'nobody') + 2}", 0)
                    )
                    async with aiohttp.ClientSession(connector=connector) as one:
                        t0 = time.monotonic()
                        wrong = _basic(user, f"wrong{i}".encode())  # never a cached one
                        async with one.get(f"{p.url}/metrics", headers=wrong) as r:
                            await r.read()
                        if i:  # the first of each: the dummy hash is made on first use
                            took[user].append(time.monotonic() - t0)
    finally:
        p.kill()
    known, unknown = (statistics.median(took[u]) * 1000 for u in ("prometheus", "nobody"))
    return Row(
        "user-name timing: a cost-12 user, wrong password vs unknown user (7 each, median)",
        f"known user {known:.0f} ms, unknown user {unknown:.0f} ms",
        "n/a",
    )


async def _status_ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def sysfs_link(tree: Path, work: Path) -> Row:
    """product_name, serial_number and unique_id of the AMD GPU linked to a file outside
    --path.sysfs."""
    node = SimulatedNode(parse_scenario(NODE, name="round3"), work / "links")
    await node.start()
    node.advance()
    secret = work / "outside-secret"
    secret.write_text(f"{SECRET}\n")
    dev = node.workdir / "sysfs" / AMD_DEV
    for name in ("product_name", "serial_number", "unique_id"):
        (dev / name).unlink(missing_ok=True)
        os.symlink(secret, dev / name)
    p = Process(
        tree,
        work / "links.log",
        [*node.exporter_args(), "--collect-interval", "1s"],
        dict(node.env()),
    )
    try:
        async with aiohttp.ClientSession() as http:
            await _ready(http, p)
            await asyncio.sleep(1.5)
            async with http.get(f"{p.url}/metrics") as r:
                text = await r.text()
            m = await read_metrics(http, p.url)
    finally:
        p.kill()
        await node.stop()
        for part in node.parts:
            part.close()
    leaked = sum(SECRET in line for line in text.splitlines())
    errors = value(m, "kube_device_exporter_source_field_errors_total", source="amdgpu")
    return Row(
        "product_name, serial_number, unique_id of an AMD GPU linked to a file outside "
        "--path.sysfs",
        f"{leaked} series carry the file's first line; amdgpu field errors {errors}",
        "n/a",
    )


async def duplicate_pods() -> Row:
    """The same pod three times in one List, through the poller and the renderer."""
    from exporter.model import PodResourcesState
    from tests.support.duplicates import TRAINER, duplicate_series, text_of

    text = await text_of(PodResourcesState(pods=(TRAINER, TRAINER, TRAINER), api_version="v1"))
    dups = duplicate_series(text)
    return Row(
        "the same pod listed three times in a PodResources List (in-process poller and renderer)",
        f"{len(dups)} series more than once",
        "n/a",
    )


async def sighup(tree: Path, work: Path) -> Row:
    p = _one_user_exporter(tree, work, "hup", cost=4)
    try:
        async with aiohttp.ClientSession() as http:
            await within(lambda: _status_ok(http, f"{p.url}/healthz"), 20)
        p.proc.send_signal(signal.SIGHUP)
        logged = await within(lambda: "SIGHUP" in p.log() or p.proc.poll() is not None, 5)
        alive = p.proc.poll() is None
        line = next((ln for ln in p.log().splitlines() if "SIGHUP" in ln), "no log line")
    finally:
        p.kill()
    return Row(
        "SIGHUP to an exporter with --web.config.file",
        f"{'alive' if alive else f'DIED (exit {p.proc.returncode})'}; "
        f"{line.split(': ', 1)[-1] if alive else 'no log line'}",
        f"{logged:.1f} s to the log line" if logged is not None and alive else "n/a",
    )


async def run(tree: Path, long: bool = False) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="kde-faults-r3-") as tmp:
        work = Path(tmp)
        rows = await stuck_reads(tree, work)
        rows.append(await web_config_emptied(tree, work))
        rows.append(await password_flood(tree, work, 250, 60.0 if long else 20.0))
        rows.append(await user_name_timing(tree, work))
        rows.append(await sysfs_link(tree, work))
        rows.append(await sighup(tree, work))
        rows.append(await duplicate_pods())
        rows += await fault_rows(tree, work)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_and_web_faults")
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="source tree to run")
    parser.add_argument("--soak", action="store_true", help="the long versions")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.tree.resolve(), args.soak))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
