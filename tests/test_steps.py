"""Snapshot steps (exporter/cycle/steps.py): a step that raises loses only its own part."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from exporter.cycle.steps import Steps
from exporter.model import Snapshot


def _broken(snapshot: Snapshot, cpu_nodes: Mapping[int, int]) -> Snapshot:
    raise ZeroDivisionError("a bug")


def _counted(snapshot: Snapshot, cpu_nodes: Mapping[int, int]) -> Snapshot:
    return replace(snapshot, cycles_total=snapshot.cycles_total + 1)


def test_a_failing_step_is_skipped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps([_broken, _counted])
    first = steps(Snapshot(timestamp=1.0, node="n"), {})
    second = steps(Snapshot(timestamp=2.0, node="n"), {})
    assert (first.cycles_total, second.cycles_total) == (1, 1)
    failures = [r for r in caplog.records if "_broken failed" in r.getMessage()]
    assert len(failures) == 1
    assert "ZeroDivisionError('a bug')" in failures[0].getMessage()
