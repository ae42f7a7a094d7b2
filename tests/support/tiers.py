"""The fast loop's two markers, and what holds them to their word (a pytest plugin, named by
tests/conftest.py).

- `peer`: the test starts a process (the exporter or the simulated node as a command,
  Prometheus, promtool, Chromium, Docker, kubectl, kustomize, helm, openssl, pip, git, a
  kubelet, a cluster). A test without the marker that starts one fails, naming the marker:
  the fast loop cannot quietly grow a process.
- `slow`: the test runs in process but waits out real time (a timeout, a back-off, a flood
  of bcrypt guesses, many cycles): half a second or more here. An unmarked test that took
  SLOW_SECONDS is named at the end of the run.

`make test-fast` is `pytest -m "not peer and not slow"`; `make test` runs every test, so no
test can fall between the two.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

SLOW_SECONDS = 1.0
"""An unmarked test past this (setup and call) is listed as one to mark `slow`; above the
half second that defines the marker, so that a loaded machine does not list borderline
tests."""

_took: dict[str, float] = {}


@contextlib.contextmanager
def _processes_refused(item: pytest.Item) -> Iterator[None]:
    """While `item` (not marked `peer`) sets up and runs, starting a process fails it."""
    if item.get_closest_marker("peer") is not None:
        yield
        return

    def refuse(self: subprocess.Popen[Any], args: object, *_: object) -> NoReturn:
        raise AssertionError(
            f"{item.nodeid} starts a process ({args!r}): mark it `@pytest.mark.peer` "
            "(tests/support/tiers.py) so that make test-fast leaves it out"
        )

    # Popen.__init__ closes its pipes when this raises, as it does when exec fails.
    real = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        subprocess.Popen._execute_child = real  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _processes_refused(item):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _processes_refused(item):
        yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call") and not {"peer", "slow"} & set(report.keywords):
        _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    unmarked = sorted(nodeid for nodeid, took in _took.items() if took >= SLOW_SECONDS)
    if unmarked:
        terminalreporter.write_sep("-", f"over {SLOW_SECONDS:g} s without `slow` or `peer`")
        for nodeid in unmarked:
            terminalreporter.write_line(f"{nodeid}: {_took[nodeid]:.1f} s")
