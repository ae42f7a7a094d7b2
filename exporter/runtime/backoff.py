"""Exponential back-off: how long to wait after each failure in a row.

The PodResources client (the kubelet's rate limit: no call until the wait is over) and the
pod watcher (a failed list or watch) wait `initial` after the first failure, `factor`
times longer after each further one, never longer than `cap`, and start over after a
success. `initial` 0 turns waiting off (one-shot commands: doctor, podresources).
"""

from __future__ import annotations


class Backoff:
    __slots__ = ("_wait", "cap", "factor", "initial")

    def __init__(self, initial: float, cap: float, factor: float = 2.0) -> None:
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self._wait = 0.0

    def failure(self) -> float:
        """The wait after one more failure in a row (multiplied from the last wait, so a
        failure count in the thousands cannot overflow a float)."""
        self._wait = min(self.cap, max(self.initial, self._wait * self.factor))
        return self._wait

    def success(self) -> None:
        """The next failure waits `initial` again."""
        self._wait = 0.0
