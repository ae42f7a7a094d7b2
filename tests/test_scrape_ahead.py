"""The /metrics body built before the scrape: value formatting against prometheus_client,
when bodies are built ahead (the scrape cadence), and the running exporter serving them."""

from __future__ import annotations

import asyncio
import gzip
import math
from pathlib import Path

import aiohttp
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from exporter.app import Exporter
from exporter.sinks.cadence import FORGET_AFTER, FORGET_NOT_BEFORE, ScrapeCadence
from exporter.sinks.gofloat import go_float, go_floats
from exporter.sinks.prometheus import PrometheusSink, reference
from tests.support import StaticSource
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import gpu_result
from tests.support.snapshots import snapshot

OM_GZIP = (True, True)
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1e7, 9_999_999.0, 12_345_678.5,
         -12_345_678.5, 1e16, 1.5e16, 1e22, 5e-324, -5e-324, 1.7976931348623157e308, 1e-7,
         81_559_420_928.0, 0.1, 1 / 3, 100.0, 123_456.789]  # fmt: skip


def oracle(value: float) -> str:
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**60), 2**60).map(float))
@example(-0.0)
@example(1e7)
def test_one_value_is_written_as_prometheus_client_writes_it(value: float) -> None:
    assert go_float(value) == oracle(value)


@given(
    st.lists(st.floats() | st.sampled_from(EDGES), max_size=60),
    st.lists(st.floats() | st.sampled_from(EDGES), max_size=60),
)
def test_values_looked_up_from_the_last_cycle_are_written_the_same(
    first: list[float], second: list[float]
) -> None:
    texts, lookup = go_floats(first, {})
    assert texts == [oracle(v) for v in first]
    again, _ = go_floats(second, lookup)
    assert again == [oracle(v) for v in second]


def test_minus_zero_after_zero_and_the_edges() -> None:
    _, lookup = go_floats([0.0, 1e7, math.nan], {})
    texts, _ = go_floats([-0.0, 1e7, math.nan, *EDGES], lookup)
    assert texts[:3] == ["-0.0", "1e+07", "NaN"]
    assert texts == [oracle(v) for v in [-0.0, 1e7, math.nan, *EDGES]]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def simulate(cycle: float, scrapes: list[float], until: float) -> tuple[int, int, int]:
    """Cycles every `cycle` s and scrapes at the given times, merged in time order:
    (cycles that built ahead, scrapes that found their body ready, scrapes)."""
    clock = Clock()
    cadence = ScrapeCadence(clock)
    events = [(k * cycle, "cycle") for k in range(1, int(until / cycle) + 1)]
    events += [(t, "scrape") for t in scrapes if t <= until]
    built_for_latest = False
    builds = ready = asked = 0
    for at, what in sorted(events):
        clock.now = 1000.0 + at
        if what == "cycle":
            built_for_latest = OM_GZIP in cadence.cycle_done()
            builds += built_for_latest
        else:
            asked += 1
            ready += built_for_latest
            cadence.asked(OM_GZIP)
    return builds, ready, asked


def test_a_15s_scrape_of_a_1s_cycle_finds_its_body_ready_and_few_cycles_build() -> None:
    scrapes = [0.4 + 15 * k for k in range(40)]
    builds, ready, asked = simulate(1.0, scrapes, until=600.0)
    assert asked == 40
    assert ready >= asked - 2  # the first scrape (and the second: period not known yet)
    assert builds <= 3 * asked  # not 600: only the cycles just before a scrape


def test_a_scrape_every_cycle_finds_every_body_ready() -> None:
    _builds, ready, asked = simulate(1.0, [0.5 + k for k in range(100)], until=100.0)
    assert ready >= asked - 2 and asked == 100


def test_two_prometheus_replicas_at_different_offsets_both_find_it_ready() -> None:
    scrapes = sorted([2.3 + 15 * k for k in range(20)] + [9.8 + 15 * k for k in range(20)])
    builds, ready, asked = simulate(1.0, scrapes, until=300.0)
    assert ready >= asked - 3
    assert builds < 300 / 2


def test_replicas_with_short_and_long_gaps_find_it_ready_without_a_build_each_cycle() -> None:
    """Gaps of 3 s and 12 s: the long one is first seen 12 s after the short one, which used
    to be past three short gaps (the format forgotten before every scrape: none ready); and
    the next gap is the one before the last, not the shorter (a build every cycle of the
    long gap)."""
    scrapes = sorted([2.0 + 15 * k for k in range(20)] + [5.0 + 15 * k for k in range(20)])
    builds, ready, asked = simulate(1.0, scrapes, until=300.0)
    assert ready >= asked - 2  # the first two: no gap known yet
    assert builds < 300 / 2


def test_an_odd_curl_in_the_same_format_costs_the_prometheus_scrapes_at_most_one_miss() -> None:
    scrapes = [0.4 + 15 * k for k in range(40)]
    curls = [31.0, 200.0, 401.5]
    _, ready, asked = simulate(1.0, sorted(scrapes + curls), until=600.0)
    assert asked == 43
    assert ready >= asked - 2 - len(curls) - 2  # the first two, the curls, two after them


def test_an_odd_short_gap_does_not_build_every_cycle_of_the_long_gap_after_it() -> None:
    """After an odd short gap the gap before last predicts a scrape at once; it does not
    come, and the body is not built every cycle until it does: a few builds a curl more,
    not a period's worth (a 1,000-pod node pays each build)."""
    scrapes = [0.4 + 15 * k for k in range(40)]
    curls = [31.0, 200.0, 401.5]
    plain, _, _ = simulate(1.0, scrapes, until=600.0)
    builds, ready, asked = simulate(1.0, sorted(scrapes + curls), until=600.0)
    assert builds <= plain + 5 * len(curls)  # waiting on each predicted scrape: 115
    assert ready >= asked - 2 - len(curls) - 2
    # the bench's rounds (bench/ab.py): a scrape at a window's start, 15 s in and its end,
    # windows of 30 s back to back: gaps of 15, 15 and almost nothing
    rounds = sorted(t + 30 * k for k in range(10) for t in (10.0, 25.0, 39.99))
    builds, ready, asked = simulate(1.0, rounds, until=310.0)
    assert builds < 310 / 4  # waiting built every cycle of each round's second half: 145
    assert ready >= 19


def test_a_format_nobody_asks_for_any_more_is_no_longer_built() -> None:
    """A scraper gone for three periods: its format is forgotten, not built every cycle."""
    clock = Clock()
    cadence = ScrapeCadence(clock)
    cadence.asked(OM_GZIP)
    clock.now += 15
    cadence.asked(OM_GZIP)
    clock.now += 13.5
    assert cadence.cycle_done() == []  # cycles of 1 s from here: the next is 1.5 s off
    clock.now += 1
    assert cadence.cycle_done() == [OM_GZIP]  # due in 0.5 s
    due = []
    gone = max(FORGET_AFTER * 15, int(FORGET_NOT_BEFORE))
    for _ in range(gone):  # 1 s cycles, no scrape
        clock.now += 1
        due.append(cadence.cycle_done())
    assert due[0] == [OM_GZIP]  # overdue: built in case it is only late
    assert due[-1] == []  # three periods (and a minute) without it: forgotten
    clock.now += 1
    cadence.asked(OM_GZIP)  # back: the period is learnt again
    clock.now += 14.5
    cadence.cycle_done()
    clock.now += 1
    assert cadence.cycle_done() == []  # asked once since: its next scrape builds it


def _scraped_every_second() -> tuple[PrometheusSink, Clock]:
    """A sink whose scraper (OpenMetrics, gzip) has come twice, a second apart, and its
    clock."""
    clock = Clock()
    sink = PrometheusSink(process_metrics=False, cadence=ScrapeCadence(clock))
    for _ in range(2):
        sink.asked(openmetrics=True, gzipped=True)
        clock.now += 1
    return sink, clock


def test_the_sink_builds_the_asked_format_at_the_end_of_the_cycle() -> None:
    sink, _ = _scraped_every_second()
    sink.update(snapshot(util=0.25))
    assert sink._rendered is None  # update only takes the snapshot: the cycle's time
    sink.build_due()
    rendered = sink._rendered
    assert rendered is not None and sink.cached
    assert rendered.cached(openmetrics=True, gzipped=True)
    assert not rendered.cached(openmetrics=False, gzipped=False)  # nobody asked for it
    body, _ = rendered.body(openmetrics=True, gzipped=True)
    assert gzip.decompress(body) == reference(snapshot(util=0.25))[1]


def test_a_scrape_during_the_cycles_build_takes_the_last_cycles_body_at_once() -> None:
    """From `update` to the end of `build_due` (the cycle's publish and after stages), a
    scrape of a format due is served the body built a cycle ago instead of waiting for the
    build; a format not due, or a body two cycles old (the last build failed), is not."""
    sink, clock = _scraped_every_second()
    sink.update(snapshot(util=0.25))
    assert sink.ready_body(openmetrics=True, gzipped=True) is None  # nothing built yet
    sink.build_due()
    first = sink.ready_body(openmetrics=True, gzipped=True)
    assert first is not None
    assert gzip.decompress(first[0]) == reference(snapshot(util=0.25))[1]
    assert sink.ready_body(openmetrics=False, gzipped=False) is None  # nobody asked for it

    sink.asked(openmetrics=True, gzipped=True)
    clock.now += 1
    sink.update(snapshot(util=0.75))  # this cycle's body is being built...
    assert sink.ready_body(openmetrics=True, gzipped=True) == first  # ...the last one meanwhile
    sink.build_due()
    second = sink.ready_body(openmetrics=True, gzipped=True)
    assert second is not None
    assert gzip.decompress(second[0]) == reference(snapshot(util=0.75))[1]

    sink.asked(openmetrics=True, gzipped=True)
    clock.now += 1
    sink.update(snapshot(util=0.5))  # its build fails (build_due never runs)...
    clock.now += 1
    sink.update(snapshot(util=0.125))  # ...so the next cycle has no body standing in
    assert sink.ready_body(openmetrics=True, gzipped=True) is None
    rendered = sink.rendered  # the scrape renders the latest snapshot itself
    assert rendered is not None
    assert rendered.openmetrics == reference(snapshot(util=0.125))[1]


@pytest.mark.slow
async def test_the_exporter_serves_a_body_built_before_the_scrape(tmp_path: Path) -> None:
    exporter = Exporter(
        config_for(tmp_path / "none.sock"), sources={"fake": StaticSource(gpu_result())}
    )
    await exporter.start()
    headers = {"Accept": "application/openmetrics-text", "Accept-Encoding": "gzip"}
    try:
        await exporter.wait_ready(10)
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            for _ in range(3):  # scrapes every cycle: the cadence is learnt
                async with http.get(f"{exporter.url}metrics", headers=headers) as r:
                    assert r.status == 200
                await asyncio.sleep(0.2)
            sink, poller = exporter.prometheus, exporter.poller
            seen = poller.snapshot
            for _ in range(300):  # a new cycle, not scraped yet (200 ms cycles: 3 s deadline)
                if poller.snapshot is not seen:
                    break
                await asyncio.sleep(0.01)
            assert poller.snapshot is not seen
            rendered = sink._rendered
            assert rendered is not None and rendered.cached(openmetrics=True, gzipped=True)
            ahead, _ = rendered.body(openmetrics=True, gzipped=True)
            async with http.get(f"{exporter.url}metrics", headers=headers) as r:
                served = await r.read()
                assert r.headers["Content-Encoding"] == "gzip"
            if sink._rendered is rendered:  # no cycle ended in between: the same bytes
                assert served is not None and served == ahead
            assert gzip.decompress(served).endswith(b"# EOF\n")
    finally:
        await exporter.stop()
