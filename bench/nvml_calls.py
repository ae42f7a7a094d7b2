"""`python -m bench nvml-calls`: what each NVML call the NVML source makes costs, per cycle,
against whatever libnvidia-ml.so.1 the binding loads (the real driver on a GPU machine;
the stand-in with `LD_LIBRARY_PATH` and `KDE_FAKENVML_STATE` from `kde-simulate --node-only`).

Every C entry point nvidia-ml-py resolves is wrapped with a timer, so the table shows the
library's own time per call; the last rows show the whole `collect()` (binding and our
Python included) for comparison, and its floor: the very C calls of one cycle, with the
very arguments, replayed back to back through ctypes with no Python around them (what a
source that did nothing but call NVML would cost; the binding's own work, building
arguments and results, is above it and in `collect()`). collect() is timed on a source
with no timer in its calls (made before they are put in), in rounds alternating with the
floor's; each side's fastest round counts.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import defaultdict
from typing import Any

import pynvml

from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource

COUNTING = [0]
"""The thread whose calls are counted: the one running collect(); 0 while none is."""
RECORDING: list[list[tuple[Any, tuple[Any, ...]]]] = []
"""While it holds a list: each counted call's (C function, arguments) go into it, for the
floor's replay."""


class _Timed:
    """A ctypes function pointer that adds its own time to `totals`."""

    def __init__(self, name: str, fn: Any, totals: dict[str, list[float]]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_totals", totals)

    def __call__(self, *args: Any) -> Any:
        if threading.get_ident() != COUNTING[0]:  # the XID thread's blocking wait, teardown
            return self._fn(*args)
        if RECORDING:
            RECORDING[0].append((self._fn, args))
        started = time.perf_counter()
        try:
            return self._fn(*args)
        finally:
            entry = self._totals[self._name]
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fn, name, value)  # restype/argtypes set by the binding


def _record(source: NvmlSource) -> list[tuple[Any, tuple[Any, ...]]]:
    """One collect()'s C calls (function, arguments), from a source made under the timers;
    the arguments keep the structures they point into alive."""
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    RECORDING.append(calls)
    try:
        source.collect()
    finally:
        RECORDING.clear()
    return calls


def _side_by_side(
    bare: NvmlSource, calls: list[tuple[Any, tuple[Any, ...]]], cycles: int, rounds: int = 10
) -> tuple[float, float]:
    """Seconds per cycle of `bare.collect()` and of the same C calls replayed bare (see the
    module's docstring), in alternating rounds, each side's fastest round: on a shared
    machine noise only ever adds time (as `timeit` takes the minimum), and one side's round
    that met a neighbour's burst, or the stand-in reloading its state, says nothing of it."""
    fastest = [float("inf"), float("inf")]
    per_round = max(1, cycles // rounds)
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            bare.collect()
        fastest[0] = min(fastest[0], time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(per_round):
            for fn, args in calls:
                fn(*args)
        fastest[1] = min(fastest[1], time.perf_counter() - started)
    return fastest[0] / per_round, fastest[1] / per_round


def measure(cycles: int) -> tuple[dict[str, list[float]], float, int, float]:
    """(per-call totals, collect() seconds per cycle, devices, the floor's seconds per
    cycle). collect() is timed on a source made before the timers are put in (nothing of
    the bench in its calls); the per-call table comes from a second one made under them."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    resolve = pynvml._nvmlGetFunctionPointer
    wrapped: dict[str, _Timed] = {}

    def timed_pointer(name: str) -> Any:
        if name not in wrapped:
            wrapped[name] = _Timed(name, resolve(name), totals)
        return wrapped[name]

    bare = NvmlSource(SourceContext(logger=logging.getLogger("bench.nvml")))
    source: NvmlSource | None = None
    try:
        for _ in range(3):  # warm-up: handles, GPM baselines, field ids
            result = bare.collect()
        pynvml._nvmlGetFunctionPointer = timed_pointer
        source = NvmlSource(SourceContext(logger=logging.getLogger("bench.nvml")))
        for _ in range(3):
            source.collect()
        totals.clear()
        COUNTING[0] = threading.get_ident()
        for _ in range(cycles):
            source.collect()
        calls = _record(source)
        COUNTING[0] = 0
        pynvml._nvmlGetFunctionPointer = resolve
        per_cycle, floor = _side_by_side(bare, calls, cycles)
    finally:
        COUNTING[0] = 0
        pynvml._nvmlGetFunctionPointer = resolve
        bare.close()
        if source is not None:
            source.close()
    return totals, per_cycle, len(result.readings), floor


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench nvml-calls")
    parser.add_argument("--cycles", type=int, default=200)
    args = parser.parse_args(argv)
    totals, per_cycle, devices, floor = measure(args.cycles)
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    library = sum(t for _, t in totals.values()) / args.cycles
    print(f"NVML calls per cycle of the NVML source ({devices} devices, {args.cycles} cycles)\n")
    print("| call | calls per cycle | µs per call | µs per cycle |")
    print("|---|---|---|---|")
    for name, (count, seconds) in rows:
        print(
            f"| `{name}` | {count / args.cycles:.1f} | {seconds / count * 1e6:.1f} | "
            f"{seconds / args.cycles * 1e6:.0f} |"
        )
    print(f"| **library, all calls** | | | **{library * 1e6:.0f}** |")
    print(f"| **collect(), binding and our Python included** | | | **{per_cycle * 1e6:.0f}** |")
    print(
        f"| **floor: the same C calls replayed bare through ctypes** | | | **{floor * 1e6:.0f}** |"
    )
    print(f"\ncollect() / floor: {per_cycle / floor:.2f}x")
    return 0
