"""docs/performance.md from one bench run."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import measured
from bench.churn import SHRUNK_CYCLES, SWINGS, VARIANTS
from bench.cost import BREAKDOWN, Cost, FloorRatio, Growth, Wakeups, fit
from bench.fleet import Fleet, OtlpVolume
from bench.generate import HELD_PODS, generated_name, held_name
from bench.labels import Placement
from bench.scrape import OURS, SLOW_EXPORTERS, STATIC, WARMUP_ROUNDS, Latency, table
from bench.startup import IMPORT, Startup
from bench.threads import Threads
from bench.threads import table as threads_table

MIB = 2**20
BUDGET_SHARE = 0.01
BUDGET_RSS = 70 * MIB
BUDGET_P50 = 1.5
BUDGET_SCALE = 8.0
BUDGET_FLOOR = 1.2
"""Exporter CPU / the floor of the same work (bench/floor.py), at 1 s and at 30 s (issue 43)."""
BUDGET_NVML = 3.0
"""NVML collect() / the same cycle's C calls replayed bare (bench/nvml_calls.py)."""
BUDGET_HELD = 2.0
"""CPU per cycle of `dense` and 1,000 pods more holding devices / `dense`'s (issue 43)."""
FLEET_NODES = (1_000, 10_000)
FLEET_INTERVALS = (15, 60)


@dataclass
class Results:
    machine: str
    costs: dict[str, list[Cost]] = field(default_factory=dict)
    latency: list[Latency] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    churn: dict[str, float] = field(default_factory=dict)
    fleet: list[Fleet] | None = None
    otlp: list[OtlpVolume] = field(default_factory=list)
    nvml_calls: str = ""
    gpm: str = ""
    """`python -m bench gpm`'s table."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """dense at 1 s: CPU per cycle of each cost.BREAKDOWN configuration."""
    wakeups: list[Wakeups] = field(default_factory=list)
    floor: list[FloorRatio] = field(default_factory=list)
    """dense: exporter vs the floor of the same work (bench/floor.py), 1 s and 30 s."""
    startup: Startup | None = None
    grpc_idle: list[dict[str, float]] = field(default_factory=list)
    """bench/grpc_idle.py: a channel kept open vs closed between `List` calls."""
    threads: Threads | None = None
    """bench/threads.py: dense at 1 s, CPU per cycle thread by thread."""
    growth: list[Growth] = field(default_factory=list)
    """The 64-GPU and the 1,000-pod nodes against `dense`, side by side (cost.growth)."""


def _cost(results: Results, scenario: str, interval: str) -> Cost:
    return next(c for c in results.costs[scenario] if c.interval == interval)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _budget(r: Results) -> list[str]:
    dense = _cost(r, "dense", "1s")
    p50 = {(lat.target, lat.cadence): lat.p50_ms for lat in r.latency}
    cadences = list(dict.fromkeys(lat.cadence for lat in r.latency))
    ratios = [p50[(OURS, c)] / p50[(STATIC, c)] for c in cadences]
    return [
        "## The budget (issue 12)\n\n",
        "| on `dense` at a 1 s interval | budget | measured | |\n|---|---|---|---|\n",
        f"| share of one core | < 1 % | {dense.core_share:.2%} | "
        f"{_verdict(dense.core_share < BUDGET_SHARE)} |\n",
        f"| RSS (stand-in NVML library included) | < 70 MiB | {dense.rss_bytes / MIB:.0f} MiB | "
        f"{_verdict(dense.rss_bytes < BUDGET_RSS)} |\n",
        f"| `/metrics` p50 / static handler's, scraped every cycle and every 15 s | < 1.5x | "
        f"{ratios[0]:.2f}x, {ratios[1]:.2f}x | {_verdict(max(ratios) < BUDGET_P50)} |\n",
        _growth_row(
            r, generated_name(64), "64 GPUs (1,600 pods) / 8 GPUs", BUDGET_SCALE, "{:.1f}x"
        ),
        _growth_row(
            r,
            held_name(),
            f"{HELD_PODS:,} pods more holding time-sliced GPUs / `dense`",
            BUDGET_HELD,
            "{:.2f}x",
        ),
        *_floor_row(r),
        *_nvml_row(r),
        "\n",
        *_growth_note(r),
    ]


def _growth_row(r: Results, scenario: str, what: str, budget: float, shown: str) -> str:
    """A bigger node's CPU per cycle over dense's: the median of the side-by-side rounds,
    each round's ratio beside it."""
    g = next((g for g in r.growth if g.scenario == scenario), None)
    if g is None:
        return f"| {what}, CPU per cycle | < {budget:g}x | not measured | |\n"
    rounds = ", ".join(shown.format(x) for x in g.ratios)
    return (
        f"| {what}, CPU per cycle, side by side | < {budget:g}x | {shown.format(g.ratio)} "
        f"(rounds: {rounds}; {g.series:,} series) | {_verdict(g.ratio < budget)} |\n"
    )


def _growth_note(r: Results) -> list[str]:
    if not r.growth:
        return []
    g = r.growth[0]
    rounds = len(g.per_cycle_s)
    base = ", ".join(_ms(b) for _, b in g.per_cycle_s)
    return [
        f"The growth rows: `{g.base}` and each bigger node ran at once, an exporter on each at "
        f"1 s,\nread over the same {rounds} consecutive windows (scraped every 15 s); each "
        f"round's ratio is\nthe bigger node's CPU per cycle over `{g.base}`'s in that window, "
        f"and the row's figure is\nthe median round's. `{g.base}` in those rounds: "
        f"{base} per cycle.\n\n",
    ]


def floor_rounds(ratios: Sequence[float]) -> str:
    """Each side-by-side round's exporter/floor ratio, after the median one's figure ("" for
    a single window)."""
    if not ratios:
        return ""
    return " (rounds: " + ", ".join(f"{x:.2f}x" for x in ratios) + ")"


def _floor_row(r: Results) -> list[str]:
    if not r.floor:
        return []
    ratios = ", ".join(f"{f.ratio:.2f}x at {f.interval}{floor_rounds(f.rounds)}" for f in r.floor)
    ok = all(f.ratio <= BUDGET_FLOOR for f in r.floor)
    return [
        f"| exporter CPU / the floor of the same work (below), at 1 s and 30 s | "
        f"≤ {BUDGET_FLOOR:g}x | {ratios} | {_verdict(ok)} |\n"
    ]


def nvml_ratio(table: str) -> float | None:
    """`collect() / floor` from `python -m bench nvml-calls`'s output (two decimals: the
    verdict is on what is printed, so 3.02x is not rounded into the limit), None if absent."""
    found = re.search(r"^collect\(\) / floor: ([0-9.]+)x$", table, re.MULTILINE)
    return float(found[1]) if found else None


def _nvml_row(r: Results) -> list[str]:
    ratio = nvml_ratio(r.nvml_calls)
    if ratio is None:
        return []
    return [
        f"| NVML `collect()` / its C calls replayed bare (NVML call costs, below) | "
        f"≤ {BUDGET_NVML:g}x | {ratio:.2f}x | {_verdict(ratio <= BUDGET_NVML)} |\n"
    ]


def _costs(r: Results) -> list[str]:
    out = [
        "## CPU and memory per node\n\n",
        "Each row: one simulated node, two exporter processes reading it side by side (1 s and\n"
        "10 s collection), scraped every 15 s (OpenMetrics, gzip) as Prometheus does. CPU is\n"
        "user + system of the exporter process over the window, all threads, the stand-in NVML\n"
        "library included; per cycle = CPU / cycles run in the window (so it includes the\n"
        "process's background: the HTTP server, the scrapes).\n\n",
        "| node | series | CPU per cycle, 1 s | core share, 1 s | CPU per cycle, 10 s "
        "| core share, 10 s | RSS after warm-up | start-up to ready |\n",
        "|---|---|---|---|---|---|---|---|\n",
    ]
    for scenario, rows in r.costs.items():
        one, ten = (next(c for c in rows if c.interval == i) for i in ("1s", "10s"))
        out.append(
            f"| {scenario} | {one.series} | {_ms(one.cpu_per_cycle_s)} | {one.core_share:.2%} | "
            f"{_ms(ten.cpu_per_cycle_s)} | {ten.core_share:.2%} | {one.rss_bytes / MIB:.0f} MiB | "
            f"{one.ready_s:.2f} s |\n"
        )
    points = [(rows[0].series, rows[0].cpu_per_cycle_s) for rows in r.costs.values()]
    fixed, per_series = fit(points)
    out.append(
        f"\n**Fit** (least squares over the 1 s rows): CPU per cycle ≈ **{_ms(fixed)} + "
        f"{per_series * 1e6:.1f} µs per series**.\n\n"
    )
    return out


def _startup(r: Results) -> list[str]:
    if r.startup is None:
        return []
    slowest = ", ".join(f"`{name}` {seconds * 1000:.1f} ms" for name, seconds in r.startup.slowest)
    return [
        "**Start-up** (`python -m bench startup`, issue 27: nothing expensive at import time):\n"
        f"`{IMPORT}` takes {r.startup.import_s * 1000:.0f} ms in a fresh process (best of 7).\n"
        f"The modules slowest on their own (`-X importtime`): {slowest}. No password is\n"
        "hashed and no OTLP SDK loaded at import (tests/test_import_cost.py): the bcrypt\n"
        "dummy hash is made on the first unknown user's check.\n\n",
    ]


def _breakdown(r: Results) -> list[str]:
    if not r.breakdown:
        return []
    names = [name for name, _, _ in BREAKDOWN]
    whole = r.breakdown[names[0]]
    kubelet = whole - r.breakdown[names[1]]
    nvml = whole - r.breakdown[names[2]]
    xid = whole - r.breakdown[names[3]]
    malloc = whole - r.breakdown[names[4]]
    rows = [
        ("the kubelet: `List` and `GetAllocatableResources`, over gRPC", kubelet),
        ("NVML: collect(), the stand-in library, XID events", nvml),
        ("of which XID events (an event set collect() empties)", xid),
        ("the rest: the cycle, the join, the snapshot, HTTP, scrapes", whole - kubelet - nvml),
        ("of the whole: glibc's malloc rather than Python's own allocator", malloc),
    ]
    out = [
        "## Where a dense cycle goes\n\n",
        f"{len(BREAKDOWN)} exporters side by side on one `dense` node at 1 s, each without "
        "one part\n(`bench/cost.py` BREAKDOWN; the last runs on Python's own allocator, "
        "not the image's\n`PYTHONMALLOC=malloc`); a part's cost is the difference from the "
        "whole.\n\n",
        "| part | CPU per cycle | share of the cycle |\n|---|---|---|\n",
        f"| everything | {_ms(whole)} | 100% |\n",
    ]
    out += [f"| {label} | {_ms(v)} | {v / whole:.0%} |\n" for label, v in rows]
    out.append(
        "\nThe kubelet's part is almost all gRPC: a call finds gRPC's threads idle and pays\n"
        "for waking them every time (a `List` costs several times more CPU at 1 s spacing\n"
        "than back to back). That is why the kubelet is asked when the devices or their\n"
        "processes change (at most every 5 s) and otherwise every 30 s\n"
        "(`--kubernetes.poll-interval`; a pod running nothing on its devices is labelled up\n"
        "to that late, docs/architecture.md), why the channel is closed between\n"
        "polls (next section), and why a `List` answer is parsed only when its content\n"
        "changes: the kubelet sends it in a new order on every call (the simulated one does\n"
        "too, as the real one does), so an order-insensitive key of its bytes decides\n"
        "(docs/podresources.md, `python -m bench podresources`).\n\n"
        "The allocator row is what the image pays, on every cycle, for memory that goes back\n"
        "after a big node shrinks (next section): glibc's malloc is slower than Python's own\n"
        "for the many small objects of a cycle.\n\n"
    )
    return out


def _wakeups(r: Results) -> list[str]:
    if not r.wakeups:
        return []
    out = [
        "## Threads and wake-ups (`dense`)\n\n",
        "Exporters at 1 s, 10 s and 30 s side by side on one node, scraped every 15 s; the\n"
        "context switches (voluntary and involuntary) of all their threads over the window,\n"
        "per second (`/proc/PID/task/*/status`), and their threads at its end. Each voluntary\n"
        "switch is a thread that was woken and went back to sleep: on a big node, what an\n"
        "idle exporter costs the CPUs beyond its CPU time (issue 27 aims under 10 a second\n"
        "at 30 s).\n\n",
        "| interval | threads | context switches per second | share of one core |\n",
        "|---|---|---|---|\n",
    ]
    out += [
        f"| {w.interval} | {w.threads} | {w.switches_per_s:.1f} | {w.core_share:.2%} |\n"
        for w in r.wakeups
    ]
    out.append(
        "\nThe threads: the event loop, one per source's collect() (five on a GPU node, four\n"
        "of them asked once a minute when they find nothing; XID events are taken there too,\n"
        "from an event set each cycle empties), the publish step, the attribution's host\n"
        "reads, the NUMA map's and the loop's executor. gRPC's own (its event engine, timer\n"
        "and completion-queue poller: 6 on 2 CPUs, up to 16 event-engine threads on a big\n"
        "node) live only during a poll: the channel is closed after each.\n\n"
    )
    return [*out, *_threads(r), *_grpc_idle(r), *_floor(r)]


def _threads(r: Results) -> list[str]:
    if r.threads is None:
        return []
    return [
        f"Where a {r.threads.interval} cycle's CPU goes, thread by thread (`python -m bench "
        "threads`: one exporter\non `dense`, scraped every 15 s; each live thread's time on a "
        "CPU under the name the\nkernel shows, the threads that ended in the window as the "
        "rest of the process's CPU):\n\n",
        threads_table(r.threads),
        "\n",
    ]


def _grpc_idle(r: Results) -> list[str]:
    if not r.grpc_idle:
        return []
    out = [
        "What an open gRPC channel costs between calls (`python -m bench grpc-idle`): two\n"
        "processes side by side per spacing, each calling `List` on the simulated kubelet,\n"
        "one keeping its channel, one closing it after each call.\n\n",
        "| `List` every | channel | CPU per call | share of a core | context switches/s |\n",
        "|---|---|---|---|---|\n",
    ]
    out += [
        f"| {row['spacing_s']:g} s | {'closed between' if row['reopen'] else 'kept open'} "
        f"| {row['cpu_per_call_s'] * 1000:.2f} ms | {row['core_share']:.3%} "
        f"| {row['switches_per_s']:.1f} |\n"
        for row in r.grpc_idle
    ]
    return [*out, "\n"]


def _floor(r: Results) -> list[str]:
    if not r.floor:
        return []
    out = [
        f"**Against the floor** (issue 43: at most {BUDGET_FLOOR:g}x at 1 s and at 30 s). The\n"
        "floor (`bench/floor.py`) does only what no exporter can avoid: a bare grpcio `List`\n"
        "every cycle on a channel it keeps, the NVML C calls of `collect()` replayed through\n"
        "ctypes with nothing around them (a cycle's with the slow values and GPM due every\n"
        "10 s, a plain cycle's in between, as the source reads them), and a static aiohttp\n"
        "handler serving a gzipped /metrics body of the same size. Exporter and floor side by\n"
        "side on one `dense` node, scraped every 15 s after two warm-up scrapes (the exporter\n"
        "builds bodies ahead once it knows the scrapers' period, bench/cost.py `WARM_SCRAPES`).\n"
        "(The exporter asks the kubelet when the processes on its devices change, at most\n"
        "every 5 s, and else every 30 s: on this node, whose processes come and go, about\n"
        "every 10 s at 1 s; the floor every cycle: that difference is part of what the\n"
        "exporter saves.) The last column is a\n"
        "process that does nothing but wake once per interval (`bench/floor.py` `wake`),\n"
        "in the same run: what this machine charges for waking at all, below which neither\n"
        "can go.",
        _floor_rounds_note(r.floor),
        "\n\n",
        "| interval | exporter, share of a core | floor | ratio | | a process that only wakes |\n",
        "|---|---|---|---|---|---|\n",
    ]
    out += [
        f"| {f.interval} | {f.exporter_share:.2%} | {f.floor_share:.2%} | "
        f"{f.ratio:.2f}x{floor_rounds(f.rounds)} | "
        f"{_verdict(f.ratio <= BUDGET_FLOOR)} | {f.wake_share:.2%} |\n"
        for f in r.floor
    ]
    return [*out, "\n"]


def _floor_rounds_note(floor: Sequence[FloorRatio]) -> str:
    rounds = len(floor[0].rounds)
    if not rounds:
        return ""
    return (
        f" All of them ran over the same {rounds} consecutive windows; each interval's\n"
        "shares are those of its median round (at 30 s a window holds a few cycles, and one\n"
        "kubelet poll more or less in it moves the ratio), every round's ratio beside them."
    )


def _latency(r: Results) -> list[str]:
    counts = ", ".join(f"{lat.scrapes} ({lat.cadence})" for lat in r.latency if lat.target == OURS)
    return [
        "## Scrape latency (`dense`, 1 s cycles)\n\n",
        "Scraped as Prometheus scrapes (`bench/scrape.py`, `python -m bench scrape`): each\n"
        "scrape on a fresh connection, OpenMetrics preferred, gzip, at a moment unrelated to\n"
        "the exporter's cycle; once per cycle (one exporter, a random moment of each second),\n"
        f"and every 15 s ({SLOW_EXPORTERS} exporters side by side at offsets spread over the 15 s, "
        f"±0.5 s jitter,\nafter {WARMUP_ROUNDS} warm-up rounds: the exporter learns a "
        "scraper's period from its first two\nscrapes). The static handler (a bare aiohttp app "
        "serving the very\nbytes we served) is scraped the same way in the same run: the "
        "floor of the HTTP stack\nand the client. Scrapes of ours: "
        f"{counts}; with so few, p99 is about the\nlargest. CPU per cycle: the exporter's "
        "CPU over the phase / the cycles it ran.\n\n",
        table(r.latency),
        "\n",
    ]


def _memory(r: Results, args: argparse.Namespace) -> list[str]:
    if not r.churn:
        return []
    c = r.churn
    variants = list(VARIANTS.items())
    swings = range(1, SWINGS + 1)

    def row(moment: str, *keys: str) -> str:
        cells = [", then ".join(f"{c[p + k] / MIB:.1f} MiB" for k in keys) for p, _ in variants]
        return f"| {moment} | " + " | ".join(cells) + " |\n"

    shipped, untrimmed, pymalloc = ("", "untrimmed.", "pymalloc.")

    def over_warm(prefix: str, key: str, n: int) -> float:
        return c[f"{prefix}{key}_{n}"] - c[prefix + "warm_rss"]

    def above(prefix: str) -> str:
        return ", ".join(f"{over_warm(prefix, 'shrunk_rss', n) / MIB:.0f}" for n in swings)

    kept = max(
        over_warm(shipped, "shrunk_rss", n) / over_warm(shipped, "big_rss", n) for n in swings
    )
    cpu = c[shipped + "cpu_per_cycle_s"] / c[pymalloc + "cpu_per_cycle_s"] - 1
    blocks = ", ".join(f"{c[f'{pymalloc}shrunk_blocks_{n}']:,.0f}" for n in swings)
    heap = ", ".join(f"{c[f'{shipped}shrunk_c_heap_{n}'] / MIB:.1f}" for n in swings)
    return [
        "## Memory under churn and on a big node\n\n",
        "The real poller, join, Prometheus sink, `/api/devices` view and heap trimmer\n"
        "(`exporter/runtime/heap.py`) in processes of their own (`python -m bench churn`), "
        "8 GPUs,\n"
        "a kubelet replacing 10 of 200 pods every cycle (new names, new series), then a big\n"
        f"node, then back to 200 pods for {SHRUNK_CYCLES} cycles, {SWINGS} times. As in the "
        "exporter, the start-up\nobjects are collected and frozen after the first cycle and "
        "nothing forces a collection\nbefore a reading. One process per column, side by side; "
        "the first runs as the image\ndoes, with `PYTHONMALLOC=malloc` (Dockerfile, "
        "`exporter/runtime/heap.py` SHIPPED_ENV).\n\n",
        "| moment | " + " | ".join(v.label for _, v in variants) + " |\n",
        "|---|" + "---|" * len(variants) + "\n",
        row("warm (200 pods, 50 cycles)", "warm_rss"),
        row(f"after {int(c['cycles']):,} churn cycles", "churned_rss"),
        row(
            f"{args.big_pods:,} pods each holding all 8 GPUs ({int(c['big_series']):,} series), "
            f"{SWINGS} times",
            *(f"big_rss_{n}" for n in swings),
        ),
        row("back to 200 pods, after each time", *(f"shrunk_rss_{n}" for n in swings)),
        "| CPU per churn cycle | "
        + " | ".join(_ms(c[p + "cpu_per_cycle_s"]) for p, _ in variants)
        + " |\n\n",
        "Nothing is kept for pods that are gone: Python's live objects return to the warm "
        f"count\n({c[pymalloc + 'warm_blocks']:,.0f} allocated blocks warm on pymalloc, "
        f"{blocks} after each swing), and so do the\nbytes glibc's malloc has handed out in "
        f"the image's process: {c[shipped + 'warm_c_heap'] / MIB:.1f} MiB warm, {heap} MiB "
        "after each\nswing. What RSS keeps beyond that is allocator pages.\n\n"
        "After a cycle whose snapshot fell to half its peak or less, the heap trimmer runs a "
        "full\ncollection (it also empties CPython's free lists) and glibc's `malloc_trim(0)`, "
        "which\nreleases every free page of the heap, and both again a minute later. As the "
        f"image runs,\nRSS comes back to {above(shipped)} MiB above warm after each swing, at "
        f"most {kept:.0%} of\nwhat the big node added; without the trimmer it stays at the "
        f"peak ({above(untrimmed)} MiB\nabove warm). On "
        "Python's own allocator (pymalloc, the\ninterpreter's default) it stays "
        f"{above(pymalloc)} MiB above warm, creeping towards the peak: pymalloc\nunmaps a "
        "1 MiB arena only once every object in it is freed, and the objects every cycle\n"
        "allocates keep landing in the big node's arenas, so more of them stay mapped after "
        "each\nswing. glibc's malloc costs "
        f"{cpu * 100:.0f} % more CPU per churn cycle here (on `dense`, see the allocator\n"
        "row of the breakdown above); the image pays it so that memory goes back.\n\n",
        "**Supported node size**: up to 64 GPUs with 1,600 pods (the generated row above) and "
        "up\nto 1,000 pods holding 8 GPUs each, at a 1 s interval, all under 100 MiB; a 64-GPU "
        "node at\n1 s costs a few percent of a core, so collect such nodes every 5-10 s. The "
        "kit's 384Mi\nlimit is sized for the largest node accepted at all (an 8 MiB `List`, "
        "10,000 series:\n272 MiB; [reliability.md](reliability.md#a-huge-node)).\n\n",
    ]


def _placements(r: Results) -> list[str]:
    base = r.placements[0].text_bytes
    out = [
        "## Which labels every series carries\n\n",
        "One `dense` scrape rewritten with each placement of the identity labels (text format,\n"
        "`process_*` left out).\n\n",
        "| placement | bytes | vs before | gzip -1 |\n|---|---|---|---|\n",
    ]
    for p in r.placements:
        out.append(
            f"| {p.name} | {p.text_bytes:,} | {p.text_bytes / base - 1:+.0%} | {p.gzip_bytes:,} |\n"
        )
    out.append(
        "\nThe vendor identity (driver version, serial, PCI bus id, index, minor, MIG ids) went\n"
        "to `hw_info` only: most of the saving, and a driver upgrade no longer renames every\n"
        "series. `hw_type`, `hw_vendor`, `hw_model`, `hw_parent` stay: the last few percent\n"
        "are not worth a `group_left` join in every dashboard filter and alert text.\n\n"
    )
    return out


def fleet_section(fleets: list[Fleet]) -> list[str]:
    """The Prometheus part of "The fleet": per schema and group set, and extrapolated."""
    f = fleets[0]
    out = [
        f"One real Prometheus scraped {f.nodes} simulated `dense` nodes every "
        f"{f.scrape_interval_s:g} s, side by side with an idle one (no targets); the\n"
        "difference is what the nodes cost it. One run per schema and metric-group set\n"
        "(`bench/fleet.py` SETS, `python -m bench fleet` rewrites this part alone):\n\n",
        "| exporters with | head series | per node | samples/s ingested | heap per head series "
        "| heap per node |\n",
        "|---|---|---|---|---|---|\n",
    ]
    for f in fleets:
        out.append(
            f"| {f.label} | {f.head_series:,.0f} | {f.series_per_node:,.0f} | "
            f"{f.samples_per_s:,.0f} | {f.heap_bytes_per_series:,.0f} B | "
            f"{f.heap_bytes_per_node / MIB:,.1f} MiB |\n"
        )
    out += [
        "\nHeap per head series is the busy Prometheus's heap over the idle one's, divided by\n"
        "the series: after a short run a fixed part remains in it, which weighs more where\n"
        "there are fewer series (the dcgm rows), so those rows overstate it; compare the\n"
        "series. The default groups carry a third fewer series per `dense` node than every\n"
        "group (metric groups: docs/metrics.md).\n",
        "\nExtrapolated (series per node and heap per series as measured):\n\n",
        "| exporters with | nodes | scrape interval | head series | samples/s | "
        "Prometheus heap |\n",
        "|---|---|---|---|---|---|\n",
    ]
    for f in fleets:
        for nodes in FLEET_NODES:
            for interval in FLEET_INTERVALS:
                series = nodes * f.series_per_node
                heap = series * f.heap_bytes_per_series / 2**30
                out.append(
                    f"| {f.label} | {nodes:,} | {interval} s | {series / 1e6:.2f} M | "
                    f"{series / interval:,.0f} | {heap:.1f} GiB |\n"
                )
    out.append("\n")
    return out


def _fleet(r: Results) -> list[str]:
    out = ["## The fleet\n\n"]
    if r.fleet:
        out += fleet_section(r.fleet)
    if r.otlp:
        out += [
            "OTLP/HTTP (gzip) from one `dense` node exporting every 10 s, cumulative and delta\n"
            "side by side, into a counting receiver:\n\n",
            "| temporality | bytes per node per minute (wire) | protobuf before gzip | "
            "1,000 nodes | 10,000 nodes |\n|---|---|---|---|---|\n",
        ]
        for o in r.otlp:
            out.append(
                f"| {o.temporality} | {o.wire_bytes_per_min / 1024:,.0f} KiB | "
                f"{o.raw_bytes_per_min / MIB:,.1f} MiB | "
                f"{o.wire_bytes_per_min * 1000 / 60 / MIB:,.1f} MiB/s | "
                f"{o.wire_bytes_per_min * 10000 / 60 / MIB:,.1f} MiB/s |\n"
            )
        out.append("\n")
    return out


def _gpm(r: Results) -> list[str]:
    return [
        "## GPM (profiling metrics) cost\n\n",
        "`python -m bench gpm`: the NVML source on the stand-in with a fake clock stepping one\n"
        "1 s cycle at a time, GPM at its default interval (`--collector.nvml.gpm-interval=10s`)\n"
        "and, for comparison, every cycle. One GPM read is one sample call and one\n"
        "nvmlGpmMetricsGet (12 metrics) per device, GPUs and MIG slices alike; the cycle it\n"
        "falls in pays for all devices. The H100 columns apply the per-call costs measured on a\n"
        "real H100 (nvmlGpmSampleGet 0.04 ms, nvmlGpmMetricsGet 1.5 ms for 5 metrics; issue 28,\n"
        "docs/nvml.md) to the calls counted here; an H200 answers the 12 metrics in the same\n"
        "time as 5 (docs/gpu-node.md).\n\n",
        r.gpm.split("\n", 1)[-1].strip() + "\n",
    ]


def write(r: Results, args: argparse.Namespace) -> None:
    dense = _cost(r, "dense", "1s")
    out = [
        "# Performance\n\n",
        "Written by `make bench` (`python -m bench`). Every exporter measured runs in its own\n"
        "process against a simulated node in another (`kde-simulate SCENARIO\n"
        "--node-only`); CPU and memory are read from /proc. Costs compared with each other are\n"
        "measured side by side in the same run. This machine is shared and noisy: rerun for\n"
        "your own numbers. It is also a nested VM whose vCPUs halt when idle, so waking costs\n"
        "far more here than on a GPU node: docs/gpu-node.md has the same `dense` measurements\n"
        "(and the real driver's) on a GPU node's CPU, from `bench/real_gpu.sh`. Whether a\n"
        "change made the exporter cheaper: `python -m bench ab REV` runs REV's exporter and\n"
        "this tree's side by side on one node.\n\n",
        f"Machine: {r.machine}. Dense 1 s: {_ms(dense.cpu_per_cycle_s)} per cycle, "
        f"{dense.core_share:.2%} of a core, {dense.rss_bytes / MIB:.0f} MiB.\n\n",
        *_budget(r),
        *_costs(r),
        *_startup(r),
        *_breakdown(r),
        *_wakeups(r),
        *_latency(r),
        *_memory(r, args),
        *_placements(r),
        *_fleet(r),
        "## NVML call costs\n\n",
        "`python -m bench nvml-calls` times every NVML call the source makes per cycle against\n"
        "whatever `libnvidia-ml.so.1` loads. Here, against the stand-in on `dense` (so the\n"
        "per-call times are the stand-in's, not a driver's; run it on a GPU node for those):\n\n",
        r.nvml_calls.split("\n\n", 1)[-1].strip() + "\n\n",
        *_gpm(r),
    ]
    args.out.write_text("".join(out))
    if args.out.resolve() == (measured.ROOT / "docs" / "performance.md").resolve():
        measured.record(_figures(r), source="make bench (docs/performance.md)", machine=r.machine)
        measured.rewrite(measured.documents(), measured.load())


def _figures(r: Results) -> dict[str, str]:
    """The figures other pages quote from this run (bench/measured.py)."""
    dense = _cost(r, "dense", "1s")
    figures = {
        "bench.dense_1s_cpu_per_cycle": _ms(dense.cpu_per_cycle_s),
        "bench.dense_1s_core_share": f"{dense.core_share:.2%}",
        "bench.gpu64_1s_rss": f"{_cost(r, generated_name(64), '1s').rss_bytes / MIB:.0f} MiB",
    }
    if r.churn:
        peak = max(r.churn[f"big_rss_{n}"] for n in range(1, SWINGS + 1))
        figures["bench.big_pods_peak_rss"] = f"{peak / MIB:.1f} MiB"
    return figures
