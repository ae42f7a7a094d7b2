"""Energy per container (exporter/derive/energy.py) on hand-made snapshots: whole, shared by
measured use, by slice size, through churn; the series of a device always add up to its
counter and never go down. The through-Prometheus acceptance is tests/test_energy_prometheus.py."""

from __future__ import annotations

import random
from dataclasses import replace

from exporter.derive.energy import EnergyLedger
from exporter.model import (
    Allocation,
    ContainerUsage,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Owner,
    Sample,
    Snapshot,
)

GPU = "GPU-0"
A = Holder("ml", "a", "c")
B = Holder("ml", "b", "c")
C = Holder("ml", "c", "c")


def _mig(uuid: str, memory: float) -> JoinedDevice:
    device = Device(uuid, "gpu", "nvidia", "H100 MIG", "nvml", parent=GPU)
    return JoinedDevice(DeviceReading(device, (Sample("hw.gpu.memory.limit", memory),)))


_SLICES = (_mig("MIG-1", 10e9), _mig("MIG-3", 40e9))
"""Two MIG slices of GPU-0, a 1g.10gb and a 3g.40gb."""
_SLICE_ALLOCATIONS = (
    Allocation(A, "nvidia.com/mig-1g.10gb", "MIG-1", "MIG-1"),
    Allocation(B, "nvidia.com/mig-3g.40gb", "MIG-3", "MIG-3"),
)
"""A holds the small slice, B the big one."""


def _snap(
    joules: float,
    holders: tuple[Holder, ...] = (),
    *,
    used: dict[Holder, float] | None = None,
    t: float = 0.0,
    extra: tuple[JoinedDevice, ...] = (),
    allocations: tuple[Allocation, ...] = (),
) -> Snapshot:
    gpu = Device(GPU, "gpu", "nvidia", "H100", "nvml")
    reading = DeviceReading(gpu, (Sample("hw.energy", joules),))
    allocs = allocations or tuple(
        Allocation(h, "nvidia.com/gpu.shared", f"{GPU}::{i}", GPU, str(i), shared=len(holders) > 1)
        for i, h in enumerate(holders)
    )
    usage = tuple(
        ContainerUsage(GPU, Owner(h.namespace, h.pod, h.container), 1, utilization=u)
        for h, u in (used or {}).items()
    )
    return Snapshot(
        timestamp=t,
        node="n",
        devices=(JoinedDevice(reading), *extra),
        allocations=allocs,
        container_usage=usage,
    )


def _by_holder(ledger: EnergyLedger, snapshot: Snapshot) -> dict[Holder | None, float]:
    return {e.holder: round(e.joules, 6) for e in ledger.account(snapshot)}


def test_an_exclusive_holder_gets_everything_from_zero() -> None:
    ledger = EnergyLedger()
    assert _by_holder(ledger, _snap(1000.0, (A,))) == {None: 0.0, A: 0.0}
    assert _by_holder(ledger, _snap(1100.0, (A,))) == {None: 0.0, A: 100.0}
    assert _by_holder(ledger, _snap(1250.0, (A,))) == {None: 0.0, A: 250.0}


def test_a_shared_gpu_goes_by_measured_use_else_equally() -> None:
    ledger = EnergyLedger()
    ledger.account(_snap(0.0, (A, B)))
    got = _by_holder(ledger, _snap(100.0, (A, B), used={A: 0.6, B: 0.2}))
    assert got == {None: 0.0, A: 75.0, B: 25.0}
    got = _by_holder(ledger, _snap(200.0, (A, B)))  # nobody used it: idle power equally
    assert got == {None: 0.0, A: 125.0, B: 75.0}


def test_nobodys_energy_is_the_unlabelled_series() -> None:
    ledger = EnergyLedger()
    ledger.account(_snap(0.0))
    assert _by_holder(ledger, _snap(40.0)) == {None: 40.0}


def test_a_counter_read_every_few_cycles_is_settled_by_the_shares_in_between() -> None:
    ledger = EnergyLedger()
    ledger.account(_snap(0.0, (A,)))
    ledger.account(_snap(0.0, (A,)))  # A's cycle
    ledger.account(_snap(0.0, (B,)))  # A held it at this interval's start: A's cycle
    got = _by_holder(ledger, _snap(90.0, (B,)))  # B's cycle; the counter moves now
    assert got == {None: 0.0, A: 60.0, B: 30.0}


def test_a_departed_container_keeps_its_series_and_its_last_interval() -> None:
    ledger = EnergyLedger(linger=600.0)
    ledger.account(_snap(0.0, (A, B), t=0.0))
    got = _by_holder(ledger, _snap(100.0, (A,), t=1.0))  # B left during this interval
    assert got == {None: 0.0, A: 50.0, B: 50.0}
    got = _by_holder(ledger, _snap(200.0, (A,), t=500.0))
    assert got == {None: 0.0, A: 150.0, B: 50.0}
    got = _by_holder(ledger, _snap(300.0, (A,), t=700.0))  # linger over: B is forgotten
    assert got == {None: 0.0, A: 250.0}


def test_a_counter_that_went_down_only_moves_the_baseline() -> None:
    ledger = EnergyLedger()
    ledger.account(_snap(500.0, (A,)))
    ledger.account(_snap(600.0, (A,)))
    assert _by_holder(ledger, _snap(10.0, (A,))) == {None: 0.0, A: 100.0}
    assert _by_holder(ledger, _snap(30.0, (A,))) == {None: 0.0, A: 120.0}


def test_mig_slices_share_their_gpus_energy_by_size() -> None:
    slices, allocs = _SLICES, _SLICE_ALLOCATIONS
    ledger = EnergyLedger()
    ledger.account(_snap(0.0, extra=slices, allocations=allocs))
    got = _by_holder(ledger, _snap(100.0, extra=slices, allocations=allocs))
    assert got == {None: 0.0, A: 20.0, B: 80.0}


def test_series_sum_to_the_counter_and_never_go_down_through_random_churn() -> None:
    rng = random.Random(7)
    ledger = EnergyLedger(linger=1e9)
    pool = [Holder("ns", f"pod-{i}", "c") for i in range(12)]
    energy = first = 5000.0
    last: dict[Holder | None, float] = {}
    for cycle in range(1, 400):
        holders = tuple(h for h in pool if rng.random() < 0.3)
        used = {h: rng.choice([0.0, 0.1, 0.5, 0.9]) for h in holders if rng.random() < 0.7}
        if cycle % 5 == 0:  # the counter is read every 5 cycles, as slow fields are
            energy += rng.uniform(100.0, 700.0)
        series = {e.holder: e.joules for e in ledger.account(_snap(energy, holders, used=used))}
        assert abs(sum(series.values()) - (energy - first)) < 1e-6
        for holder, value in last.items():
            assert series[holder] >= value - 1e-9, (cycle, holder)
        for holder in holders:
            assert holder in series, "a holder has its series from its first cycle"
        last = series
    assert sum(1 for v in last.values() if v > 0) > 6


def test_series_stay_in_holder_order_as_holders_come_and_linger_out() -> None:
    """The series come in the holders' order (namespace, pod, container), nobody's first,
    cycle after cycle while the holders the ledger sorted once come, go and linger out."""
    rng = random.Random(11)
    ledger = EnergyLedger(linger=5.0)
    pool = [Holder("ns", f"pod-{i:02d}", "c") for i in range(30)]
    rng.shuffle(pool)
    energy = 100.0
    changed = 0
    for cycle in range(1, 120):
        holders = tuple(h for h in pool[cycle % 20 : cycle % 20 + 8] if rng.random() < 0.8)
        energy += 10.0
        series = ledger.account(_snap(energy, holders, t=float(cycle)))
        named = [e.holder for e in series if e.holder is not None]
        assert named == sorted(named, key=lambda h: (h.namespace, h.pod, h.container))
        assert len(set(named)) == len(named)
        assert series[0].holder is None
        assert set(holders) <= set(named)
        changed += len(named) != len(holders)
    assert changed  # some lingered past their last cycle


def test_use_counts_only_on_the_devices_family_and_moves_with_the_process() -> None:
    """A container's use of a device outside a GPU's family leaves that GPU split by size;
    use on one of its slices decides the split, and as the process moves, so do the shares
    (the ledger looks at each usage only when some usage is on the family)."""

    slices, allocs = _SLICES, _SLICE_ALLOCATIONS

    def snap(joules: float, device_id: str, holder: Holder) -> Snapshot:
        snapshot = _snap(joules, extra=slices, allocations=allocs)
        owner = Owner(holder.namespace, holder.pod, holder.container)
        return replace(snapshot, container_usage=(ContainerUsage(device_id, owner, 1, None, 0.5),))

    ledger = EnergyLedger()
    ledger.account(snap(0.0, "GPU-9", A))
    assert _by_holder(ledger, snap(100.0, "GPU-9", A)) == {None: 0.0, A: 20.0, B: 80.0}
    assert _by_holder(ledger, snap(200.0, "MIG-1", A)) == {None: 0.0, A: 120.0, B: 80.0}
    assert _by_holder(ledger, snap(300.0, "MIG-3", B)) == {None: 0.0, A: 120.0, B: 180.0}
    assert _by_holder(ledger, snap(400.0, "GPU-9", B)) == {None: 0.0, A: 140.0, B: 260.0}


def test_series_change_only_when_totals_do_and_a_holder_lingers_out_without_a_reading() -> None:
    """Cycles where the counter holds still give the same series; a holder that lingers
    out leaves them on a cycle where the counter did not move, and a new holder joins at 0
    on one; a moving counter is settled at once."""
    ledger = EnergyLedger(linger=10.0)
    ledger.account(_snap(0.0, (A, B), t=0.0))
    assert _by_holder(ledger, _snap(100.0, (A, B), t=1.0)) == {None: 0.0, A: 50.0, B: 50.0}
    settled = _by_holder(ledger, _snap(200.0, (A,), t=2.0))  # B left: lingers
    assert settled == {None: 0.0, A: 100.0, B: 100.0}
    assert _by_holder(ledger, _snap(200.0, (A,), t=3.0)) == settled
    assert _by_holder(ledger, _snap(200.0, (A,), t=12.5)) == {None: 0.0, A: 100.0}
    assert _by_holder(ledger, _snap(200.0, (A, C), t=13.0)) == {None: 0.0, A: 100.0, C: 0.0}
    got = _by_holder(ledger, _snap(260.0, (A, C), t=14.0))  # shares: A 3.5, C 0.5
    assert got == {None: 0.0, A: 152.5, C: 7.5}


def test_repeated_shares_sum_to_the_very_floats_of_adding_them_each_cycle() -> None:
    """An account keeps a run of the same shares object as a count; what it sums is what
    adding each cycle's shares in turn gives, float for float and in the same order, as the
    shares repeat, change (a holder comes, use is measured) and are settled."""
    from collections import defaultdict

    from exporter.derive.energy import _Account

    rng = random.Random(43)
    third: dict[Holder | None, float] = {A: 1 / 3, B: 2 / 3}
    nobody: dict[Holder | None, float] = {None: 1.0}
    choices: list[dict[Holder | None, float]] = [third, nobody, {C: 0.1, A: 0.9}, {B: 1.0}]
    for _ in range(50):
        account = _Account()
        plain: defaultdict[Holder | None, float] = defaultdict(float)
        for _ in range(rng.randrange(1, 6)):
            shares = rng.choice(choices)
            for _ in range(rng.randrange(1, 30)):  # a run of the same object
                account.add(shares)
                for holder, share in shares.items():
                    plain[holder] += share
            if rng.random() < 0.2:  # read midway (a holder lingering out)
                assert list(account.summed().items()) == list(plain.items())
        assert list(account.summed().items()) == list(plain.items())
