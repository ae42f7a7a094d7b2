"""Files the exporter re-reads while it runs, replaced by what no operator writes (issue 41): the
web config and the RDMA pool config as a FIFO (whose open waits for a writer) or a link to
/dev/zero (a read without end); SIGHUPs by the hundred; a file touched twice a second; a
user list at bcrypt cost 12; a read stuck in a hung mount.

The web config is looked at in a worker thread, swapped in whole: the event loop (every
request, every scrape, SIGTERM) never waits for it; a bad file keeps the last good config,
loudly; a good one back is used within a look. The RDMA pool config is read in its source's
thread, never blocking. Real FIFOs and /dev/zero, in process; the exporter processes of
bench/serving_faults.py show the same from outside.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.sources import rdma
from exporter.sources.rdma import PoolConfig
from exporter.web import config as webconfig
from exporter.web.config import load_web_config
from exporter.web.reload import WebConfigWatcher
from tests.support.waiting import until

COST_12 = "$2b$12$TGgzGXWw1DtLeTijgRcmHefhwzhvP22x0of0orD2ey6.dHMrD927S"
"""bcrypt of "pw" at cost 12: a quarter of a second to check, made once for this file."""
GOOD = {"basic_auth_users": {"prometheus": COST_12}}
POOLS = '{"configList": [{"resourceName": "hca_a", "selectors": {"vendors": ["15b3"]}}]}'


def replace(path: Path, by: str) -> None:
    path.unlink()
    if by == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("by", ["fifo", "zero"])
def test_a_web_config_that_is_not_a_file_at_start_is_exit_2_naming_the_flag(
    tmp_path: Path, by: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    replace(path, by)
    started = time.monotonic()
    with pytest.raises(UsageError) as err:
        parse_config(["--web.config.file", str(path)], env={}, sources={})
    assert time.monotonic() - started < 1.0
    kind = "a FIFO" if by == "fifo" else "a character device"
    assert str(err.value) == (
        f"--web.config.file {path}: cannot read {path}: it is {kind}, not a regular file"
    )


def test_a_user_list_at_bcrypt_cost_12_loads_without_running_bcrypt(tmp_path: Path) -> None:
    """Each hash checked by its shape: 8 users at cost 12 were 2 s of bcrypt per reload."""
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {f"u{i}": COST_12 for i in range(8)}}))
    started = time.process_time()
    assert len(load_web_config(path).users) == 8
    assert time.process_time() - started < 0.1


@pytest.fixture
async def watched(tmp_path: Path) -> AsyncIterator[tuple[WebConfigWatcher, Path]]:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(GOOD))
    watcher = WebConfigWatcher(path, check_interval=0.02)
    watcher.start()
    yield watcher, path
    await watcher.close()


class LoopGaps:
    """The longest the event loop went without running a 5 ms ticker, while in the block."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopGaps:
        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                self.longest, last = max(self.longest, now - last), now

        self._task = asyncio.create_task(tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.mark.parametrize("by", ["fifo", "zero"])
async def test_a_web_config_replaced_while_running_keeps_the_last_good_and_blocks_nothing(
    watched: tuple[WebConfigWatcher, Path], by: str, caplog: pytest.LogCaptureFixture
) -> None:
    watcher, path = watched
    good = watcher.current()
    with caplog.at_level(logging.WARNING, logger="exporter.webconfig"):
        async with LoopGaps() as gaps:
            replace(path, by)
            watcher.reload(" on SIGHUP")  # a SIGHUP then too: the same
            await until(lambda: watcher.reloads["failure"] >= 1)
            assert watcher.current() is good and not watcher.last_reload_ok
            path.unlink()
            path.write_text(yaml.safe_dump(GOOD))
            await until(lambda: watcher.last_reload_ok)
    assert gaps.longest < 0.1, gaps.longest
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    kind = "a FIFO" if by == "fifo" else "a character device"
    assert f"keeping the last good: cannot read {path}: it is {kind}" in line, line


@pytest.mark.slow
async def test_sighups_while_a_reload_runs_make_one_more_reload_not_one_each(
    watched: tuple[WebConfigWatcher, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher, _ = watched
    reads: list[float] = []
    real = webconfig.read_web_config

    def slow(p: Path) -> bytes:
        reads.append(time.monotonic())
        time.sleep(0.2)  # in the worker thread: the loop would stall this long on each
        return real(p)

    monkeypatch.setattr(webconfig, "read_web_config", slow)
    await asyncio.sleep(0.05)  # the periodic looks: a stat, no read (nothing changed)
    assert reads == []
    async with LoopGaps() as gaps:
        for _ in range(200):
            watcher.reload(" on SIGHUP")
        await until(lambda: len(reads) == 2)
        await asyncio.sleep(0.4)
    assert len(reads) == 2 and gaps.longest < 0.15, (reads, gaps.longest)
    assert watcher.reloads["success"] == 2


async def test_a_touched_file_is_hashed_not_parsed(
    watched: tuple[WebConfigWatcher, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher, path = watched
    parsed: list[str] = []
    real = webconfig.parse_web_config

    def counted(text: str, directory: Path) -> webconfig.WebConfig:
        parsed.append(text)
        return real(text, directory)

    monkeypatch.setattr(webconfig, "parse_web_config", counted)
    for _ in range(5):
        path.touch()
        await asyncio.sleep(0.04)
    assert parsed == []
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": COST_12, "b": COST_12}}))
    await until(lambda: len(parsed) == 1 and set(watcher.current().users) == {"prometheus", "b"})


async def test_a_reload_stuck_in_a_read_is_abandoned_and_the_next_one_works(
    watched: tuple[WebConfigWatcher, Path], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    watcher, path = watched
    watcher.reload_seconds = 0.1
    stuck = threading.Event()
    real = webconfig.read_web_config

    def hangs(p: Path) -> bytes:
        stuck.wait(5)  # a read in a hung mount (released at the end)
        return real(p)

    monkeypatch.setattr(webconfig, "read_web_config", hangs)
    try:
        with caplog.at_level(logging.WARNING, logger="exporter.webconfig"):
            watcher.reload(" on SIGHUP")
            await until(lambda: watcher.reloads["failure"] == 1)
            monkeypatch.setattr(webconfig, "read_web_config", real)
            path.write_text(yaml.safe_dump({"basic_auth_users": {"x": COST_12}}))
            await until(lambda: set(watcher.current().users) == {"x"})
    finally:
        stuck.set()
    assert any("took longer than 0.1s" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("by", ["fifo", "zero"])
def test_a_pool_config_replaced_by_what_is_not_a_file_is_refused_at_once(
    tmp_path: Path, by: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.json"
    path.write_text(POOLS)
    pools = PoolConfig(str(path))
    assert pools.refresh() and [p.resource for p in pools.pools] == ["rdma/hca_a"]
    replace(path, by)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="exporter.sources.rdma"):
        assert not pools.refresh() and not pools.refresh()
    assert time.monotonic() - started < 0.5
    assert [p.resource for p in pools.pools] == ["rdma/hca_a"], "the last pools kept"
    [record] = caplog.records
    assert "not a regular file" in record.getMessage()
    path.unlink()
    path.write_text(POOLS)
    parses: list[object] = []
    real = rdma.parse_pool_config

    def counted(doc: object) -> list[rdma.PoolSelector]:
        parses.append(doc)
        return real(doc)

    monkeypatch.setattr(rdma, "parse_pool_config", counted)
    assert pools.refresh(), "the file back: used at the next cycle"
    path.touch()
    assert pools.refresh() and parses == [], "the same bytes again are not parsed"
