"""The one exponential back-off schedule (PodResources rate limit, the pod watch)."""

from __future__ import annotations

from exporter.runtime.backoff import Backoff


def schedule(backoff: Backoff, failures: int) -> list[float]:
    return [backoff.failure() for _ in range(failures)]


def test_waits_double_from_initial_up_to_the_cap() -> None:
    assert schedule(Backoff(1.0, 60.0), 8) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert schedule(Backoff(0.5, 2.0, factor=3.0), 3) == [0.5, 1.5, 2.0]


def test_a_success_starts_the_schedule_over() -> None:
    backoff = Backoff(1.0, 8.0)
    assert schedule(backoff, 3) == [1.0, 2.0, 4.0]
    backoff.success()
    assert schedule(backoff, 2) == [1.0, 2.0]


def test_initial_zero_never_waits() -> None:
    """doctor and `podresources` ask once: a rate-limit answer is reported, not waited out."""
    assert schedule(Backoff(0.0, 60.0), 3) == [0.0, 0.0, 0.0]


def test_a_day_of_failures_stays_at_the_cap() -> None:
    """An API server down for a day at 60 s a try: 1440 failures, past 2**1024 (a float's
    range), which a count-based `initial * 2 ** (failures - 1)` cannot compute."""
    assert schedule(Backoff(1.0, 60.0), 2000)[-1] == 60.0
