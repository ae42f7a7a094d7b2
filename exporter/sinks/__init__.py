"""Sinks read the latest snapshot and publish it: /metrics and the web app, OTLP push."""

from __future__ import annotations

from typing import Protocol

from exporter.model import Sample, Snapshot


class SnapshotSink(Protocol):
    def update(self, snapshot: Snapshot) -> None:
        """Take the new snapshot. Called once per cycle from a worker thread."""
        ...


class SelfMetrics(Protocol):
    def self_samples(self) -> tuple[Sample, ...]:
        """Exporter-scope samples (e.g. export counts) for the next snapshot."""
        ...
