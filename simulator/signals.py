"""Values that move over scenario time, with closed-form integrals.

A simulated counter (energy, bytes moved, busy time) is the integral of a rate, so it is
computed from time alone: it never goes backwards, whatever order `advance(t)` is called
in, and two runs of a scenario agree exactly.

In a scenario a signal is a number (constant) or a mapping::

    {pattern: sine, min: 0.2, max: 0.9, period: 120, phase: 30}
    {pattern: square, min: 0, max: 1, period: 60, duty: 0.25}
    {pattern: sawtooth, min: 0, max: 1, period: 300}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PATTERNS = ("constant", "sine", "square", "sawtooth")


@dataclass(frozen=True, slots=True)
class Signal:
    pattern: str = "constant"
    min: float = 0.0
    max: float = 0.0
    period: float = 60.0
    phase: float = 0.0
    """Seconds added to t (shifts the wave left)."""
    duty: float = 0.5
    """Fraction of a square period spent at `max`."""

    @staticmethod
    def constant(value: float) -> Signal:
        return Signal("constant", value, value)

    def value(self, t: float) -> float:
        if self.pattern == "constant":
            return self.max
        x = (t + self.phase) % self.period
        span = self.max - self.min
        if self.pattern == "sine":
            return self.min + span * (0.5 + 0.5 * math.sin(2 * math.pi * x / self.period))
        if self.pattern == "square":
            return self.max if x < self.duty * self.period else self.min
        return self.min + span * x / self.period

    def integral(self, t: float) -> float:
        """The integral of the signal from 0 to t."""
        if self.pattern == "constant":
            return self.max * t
        return self._from_zero(t + self.phase) - self._from_zero(self.phase)

    def _from_zero(self, x: float) -> float:
        """Integral over [0, x] of the unshifted wave."""
        p, lo, span = self.period, self.min, self.max - self.min
        periods, rest = divmod(x, p)
        if self.pattern == "sine":
            mean = lo + span / 2
            return mean * x + span / 2 * p / (2 * math.pi) * (1 - math.cos(2 * math.pi * x / p))
        if self.pattern == "square":
            high = self.duty * p
            per_period = high * self.max + (p - high) * lo
            partial = min(rest, high) * self.max + max(0.0, rest - high) * lo
            return periods * per_period + partial
        per_period = p * (lo + span / 2)
        return periods * per_period + lo * rest + span * rest * rest / (2 * p)


def parse_signal(value: Any, where: str) -> Signal:
    """A number or a pattern mapping -> Signal; ValueError names `where` and the problem."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a number or a pattern mapping, got {value!r}")
    if isinstance(value, int | float):
        return Signal.constant(float(value))
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a number or a pattern mapping, got {value!r}")
    unknown = sorted(set(value) - {"pattern", "min", "max", "period", "phase", "duty"})
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}")
    pattern = value.get("pattern", "constant")
    if pattern not in PATTERNS:
        raise ValueError(f"{where}.pattern: expected one of {', '.join(PATTERNS)}, got {pattern!r}")
    numbers = {}
    for key in ("min", "max", "period", "phase", "duty"):
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{where}.{key}: expected a number, got {v!r}")
            numbers[key] = float(v)
    signal = Signal(pattern, **numbers)
    if pattern == "constant" and "max" not in numbers:
        signal = Signal.constant(signal.min)
    if signal.period <= 0:
        raise ValueError(f"{where}.period: must be positive")
    if not 0 <= signal.duty <= 1:
        raise ValueError(f"{where}.duty: must be between 0 and 1")
    return signal
