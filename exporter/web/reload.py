"""`--web.config.file` re-read while the exporter runs, off the serving path.

Every look at the file and the certificates it names (every `check_interval` once started,
and on SIGHUP) happens in a worker thread: the files' identity first, then, when it
changed, their bytes (read as web/config.py reads them: never blocking), hashed; only bytes
that differ from those of the config in use are parsed (a touched file costs a stat and a
hash, not a parse), and the new config is swapped in whole on the event loop. A request, a
scrape or SIGTERM never waits for a reload (a FIFO in the file's place hung them all, and
ten SIGHUPs with eight cost-12 users held every scrape 10 s: issue 41); SIGHUPs that come
while one runs make one more, not one each; a reload stuck past `RELOAD_SECONDS` (a read in
a hung mount) is abandoned with its thread, said once, and the next look starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.runtime.hostfiles import read_config
from exporter.runtime.log import StateLog
from exporter.runtime.threads import DaemonWorker
from exporter.web import config as files
from exporter.web.config import WebConfig, WebConfigError

log = logging.getLogger("exporter.webconfig")

RELOAD_SECONDS = 5.0
"""A reload (stat, read, hash, parse, TLS context) takes milliseconds; one still running after
this is stuck in a read."""


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """What changes when a file is replaced or rewritten (a Secret's symlink swap too), or
    made readable."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
        except OSError:
            out.append((0, 0, 0, 0))
    return tuple(out)


def _digest(data: bytes, config: WebConfig) -> bytes:
    """The file's bytes and those of the certificates `config` names, hashed: equal digests
    are the same config."""
    h = hashlib.sha256(data)
    for path in config.tls.files() if config.tls else ():
        try:
            h.update(read_config(path))
        except OSError as exc:
            h.update(f"unreadable: {exc}".encode())
    return h.digest()


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look at the files found (in the worker thread)."""

    stamp: tuple[tuple[int, int, int, int], ...]
    config: WebConfig | None = None
    """A new config to swap in; None: nothing new."""
    digest: bytes = b""
    read: bool = False
    """The files were read (they changed, or SIGHUP asked)."""
    error: WebConfigError | None = None


class WebConfigWatcher:
    """The current WebConfig, re-read when the file or a file it names changes, or on demand
    (SIGHUP), never on the caller's thread (module docstring).

    Looked at every `check_interval` seconds once `start`ed (before: on use, at most that
    often). What a reload may not do:
    - replace a good config with an empty, unreadable, missing or invalid file (a writer
      that truncates before it writes, a Secret caught mid-update): the last good config
      stays, with a warning and `last_reload_ok` false until a good file is read;
    - turn TLS or basic auth off once either was on: a file without them is refused the
      same way (to turn them off, restart the process with such a file)."""

    def __init__(
        self,
        path: Path,
        *,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        reload_seconds: float = RELOAD_SECONDS,
    ) -> None:
        self.path = path
        self.check_interval = check_interval
        self.reload_seconds = reload_seconds
        self._clock = clock
        data = files.read_web_config(path)
        self.config = files.parse_bytes(data, path, allow_empty=True)
        self._digest = _digest(data, self.config)
        self._stamp = self._files_stamp(self.config)
        self._checked = clock()
        self.reloads: Counter[str] = Counter()
        self.last_reload_ok = True
        """False while the file on disk is not the config in use (the last reload failed)."""
        self._states = StateLog(log)
        self._worker = DaemonWorker("webconfig")
        self._running: tuple[asyncio.Future[_Look], float, str] | None = None
        """The look in the worker: its future, when it began, why (SIGHUP's words)."""
        self._again: str | None = None
        """A SIGHUP that came while a look ran: one more look after it, with these words."""
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Look at the files every `check_interval` from now on, on the running loop."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self._worker.stop()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval)
            self._checked = self._clock()
            self._look("", forced=False)

    def _files_stamp(self, config: WebConfig) -> tuple[tuple[int, int, int, int], ...]:
        return _stamp((self.path, *(config.tls.files() if config.tls else ())))

    def current(self) -> WebConfig:
        """The config in use, at once. Not `start`ed: a look at the files at most once per
        `check_interval` (in the worker, or here when no event loop runs)."""
        now = self._clock()
        if self._ticker is None and now - self._checked >= self.check_interval:
            self._checked = now
            self._look("", forced=False)
        return self.config

    def reload(self, why: str = "") -> None:
        """Read the file again (SIGHUP): in the worker, after the look in progress if one
        is (SIGHUPs meanwhile make one more look, not one each)."""
        self._look(why, forced=True)

    def reload_now(self, why: str = "") -> bool:
        """Read the file again on this thread (no event loop: tests, one-shot commands);
        False (the last good config kept) when it is refused."""
        return self._apply(self._read(forced=True), why)

    # --- the look ----------------------------------------------------------------------

    def _look(self, why: str, *, forced: bool) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._apply(self._read(forced=forced), why)
            return
        if self._running is not None:
            future, began, _ = self._running
            if not future.done() and self._clock() - began < self.reload_seconds:
                if forced:
                    self._again = why
                return
            if not future.done():
                self._abandon()
        config, stamp, digest = self.config, self._stamp, self._digest
        future = self._worker.submit(lambda: self._read(forced, config, stamp, digest))
        self._running = (future, self._clock(), why)
        future.add_done_callback(self._done)

    def _abandon(self) -> None:
        """The look in progress is stuck (a read in a hung mount): leave its thread behind."""
        self._running = None
        self.reloads["failure"] += 1
        self.last_reload_ok = False
        self._states.failed(
            "stuck",
            f"web config {self.path} not reloaded: reading it took longer than "
            f"{self.reload_seconds:g}s; keeping the last good",
        )
        self._worker.stop()
        self._worker = DaemonWorker("webconfig")

    def _done(self, future: asyncio.Future[_Look]) -> None:
        if self._running is None or self._running[0] is not future:
            return  # abandoned
        why = self._running[2]
        self._running = None
        if future.cancelled():
            return
        if (exc := future.exception()) is not None:
            look = _Look(self._stamp, error=WebConfigError(f"{type(exc).__name__}: {exc}"),
                         read=True)  # fmt: skip
        else:
            look = future.result()
        self._states.ok("stuck", f"web config {self.path} readable again")
        self._apply(look, why)
        if self._again is not None:
            again, self._again = self._again, None
            self._look(again, forced=True)

    def _read(
        self,
        forced: bool,
        config: WebConfig | None = None,
        stamp: tuple[tuple[int, int, int, int], ...] | None = None,
        digest: bytes | None = None,
    ) -> _Look:
        """In the worker: the files' stamp; when it changed (or `forced`), their bytes,
        hashed; when those are new, the parsed config."""
        config = config or self.config
        now = self._files_stamp(config)
        if not forced and now == (self._stamp if stamp is None else stamp):
            return _Look(now)
        try:
            data = files.read_web_config(self.path)
            new_digest = _digest(data, config)
            if new_digest == (self._digest if digest is None else digest):
                return _Look(now, read=True)
            parsed = self._acceptable(files.parse_bytes(data, self.path, allow_empty=False), config)
        except WebConfigError as exc:
            return _Look(now, read=True, error=exc)
        return _Look(self._files_stamp(parsed), parsed, _digest(data, parsed), read=True)

    def _apply(self, look: _Look, why: str) -> bool:
        """On the event loop: what the look found becomes the state (one swap)."""
        self._stamp = look.stamp
        if not look.read:
            return True
        if look.error is not None:
            self.reloads["failure"] += 1
            self.last_reload_ok = False
            self._states.failed(
                "reload",
                f"web config {self.path} not reloaded{why}, keeping the last good: {look.error}",
            )
            return False
        self.reloads["success"] += 1
        self.last_reload_ok = True
        self._states.ok("reload", f"web config {self.path} good again")
        if look.config is not None:
            self.config, self._digest = look.config, look.digest
            log.info("web config %s reloaded%s", self.path, why)
        elif why:
            log.info("web config %s reloaded%s (unchanged)", self.path, why)
        return True

    def _acceptable(self, config: WebConfig, current: WebConfig) -> WebConfig:
        if current.tls is not None and config.tls is None:
            raise WebConfigError("it has no tls_server_config, and TLS was on")
        if current.auth and not config.auth:
            raise WebConfigError("it has no basic_auth_users, and basic auth was on")
        return config
