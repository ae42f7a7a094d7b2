"""Energy per container: each device's energy counter, apportioned to its holders.

Every joule a device's `hw.energy` counter adds goes to exactly one series of
`hw.container.energy`: whole to an exclusive holder; on a shared device (time-slicing, MPS,
MIG slices, AMD partitions) by each holder's measured share; to the series without pod
labels while nobody holds the device. So the series of a device add up to the device's own
counter over any window (docs/attribution.md, "Energy").

Shares, per cycle, among the containers that held the device (or a slice of it) at the
*start* of the cycle's interval:

1. their processes' utilization of the device (process attribution: NVML SM samples, DRM
   fdinfo busy time), proportionally, when any of them used it;
2. else the size of what each holds: a MIG slice or partition by its memory (a 3g.40gb
   slice weighs four 1g.10gb), a whole device 1 (time-sliced holders equally);
3. a slice with an energy counter of its own is its own device, not part of its parent's.

The counter is read every slow interval (NVML: `--collector.nvml.slow-interval`, 10 s) and
keeps its value in between, so shares are summed per cycle and the energy added since the
last reading is settled by them when the counter moves.

Counters never go backwards: a container's series starts at 0 the cycle it first holds
the device (a Prometheus `increase()` then loses nothing), only grows, and stays, with its
last value, for `linger` seconds after the container left (what its last interval earned
is settled after it is gone). A counter that went down (driver reloaded) only resets the
baseline. State lives in this process: a restarted exporter starts every series at 0, as
any counter of a restarted process does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from exporter.model import ContainerEnergy, Holder, JoinedDevice, Snapshot
from exporter.runtime.evolve import evolve

ENERGY = "hw.energy"
_Shares = dict[Holder | None, float]
_NOBODY: _Shares = {None: 1.0}
"""The shares of a device nobody held (one object: `_Account.add` sees it repeat)."""
_new = tuple.__new__
_holder_order = attrgetter("namespace", "pod", "container")
"""`Holder`'s own order (its fields, in turn) as a plain tuple: compared without a call."""
LINGER_SECONDS = 600.0


@dataclass
class _Account:
    last_reading: float | None = None
    pending: dict[Holder | None, float] = field(default_factory=lambda: defaultdict(float))
    """Shares summed over the cycles since the last settlement (read through `summed`)."""
    repeat: tuple[_Shares, int] | None = None
    """(shares, cycles) while every cycle since the last settlement brought the same
    shares object (the holders and their split did not change): summed into `pending`
    when something reads it or other shares come, by the same additions in the same order,
    so the sums are the very same floats. Most cycles then hash no `Holder` (Python code)."""
    totals: dict[Holder | None, float] = field(default_factory=dict)
    seen: dict[Holder | None, float] = field(default_factory=dict)
    """When each holder last held the device (snapshot time)."""
    order: tuple[tuple[Holder | None, ...], list[int]] | None = None
    """(the holders of `totals` in its own order, the places of those but None in series
    order) when last sorted: sorted again only when the holders change (a thousand holders
    sort in a millisecond). Compared as a tuple, the same holders are the same objects:
    `Holder`'s hash and equality are Python code, never called while nothing changed."""
    series: tuple[ContainerEnergy, ...] | None = None
    """The device's series as `_series` last made them; None once `totals` changed (a
    settlement, a new holder, one lingered out). Most cycles change none: the counter is
    read every slow interval."""

    members: tuple[Mapping[Holder, set[str]], int] | None = None
    """(the holders this device had, the ledger's cycle) when they were last given their
    totals: the same object the next cycle has them all still (seen that cycle, none
    lingered out of it)."""

    def add(self, shares: _Shares) -> None:
        """This cycle's shares, to be settled with the others since the last settlement."""
        run = self.repeat
        if run is not None:
            if run[0] is shares:
                self.repeat = (shares, run[1] + 1)
                return
            self._fold()
        if not self.pending:
            self.repeat = (shares, 1)
            return
        for holder, share in shares.items():
            self.pending[holder] += share

    def summed(self) -> dict[Holder | None, float]:
        """Each holder's shares summed since the last settlement."""
        if self.repeat is not None:
            self._fold()
        return self.pending

    def _fold(self) -> None:
        assert self.repeat is not None and not self.pending
        shares, cycles = self.repeat
        self.repeat = None
        for holder, share in shares.items():
            summed = 0.0
            for _ in range(cycles):
                summed += share
            self.pending[holder] = summed


class EnergyLedger:
    """A snapshot step (Poller `steps`): adds `container_energy` to each snapshot."""

    def __init__(self, linger: float = LINGER_SECONDS) -> None:
        self.linger = linger
        self._accounts: dict[str, _Account] = {}
        self._holders: dict[str, dict[Holder, set[str]]] = {}
        """Last cycle's holders of each metered device's family."""
        self._families: tuple[object, dict[str, dict[Holder, set[str]]]] | None = None
        """(what `_family_holders` read, its answer): the same while the metered devices,
        the devices and the allocations are (never mutated: read as `previous` only)."""
        self._by_size: dict[str, tuple[Mapping[Holder, set[str]], dict[str, float], _Shares]] = {}
        """Metered device -> (holders, slice sizes, shares) of its last split by size: the
        same holders (the same `previous` object, kept above) and sizes give the same
        shares."""
        self._cycles = 0
        """`account` calls so far."""
        self._whole: dict[str, tuple[Mapping[Holder, set[str]], _Shares]] = {}
        """Metered device -> (its one holder's mapping, its shares: all to that holder),
        the same object while the holders are: `_Account.add` sees it repeat."""

    def step(self, snapshot: Snapshot, cpu_nodes: Mapping[int, int]) -> Snapshot:
        return evolve(snapshot, container_energy=self.account(snapshot))

    def account(self, snapshot: Snapshot) -> tuple[ContainerEnergy, ...]:
        now = snapshot.timestamp
        metered: dict[str, JoinedDevice] = {}
        readings: dict[str, float] = {}
        for joined in snapshot.devices:
            reading = joined.reading
            at = reading.layout.first.get(ENERGY)  # most devices (slices) have none
            if at is None:
                continue
            metered[reading.device.id] = joined
            readings[reading.device.id] = reading.values[at]
        holders = self._family_holders(snapshot, metered)
        sizes = _SliceSizes(snapshot)
        # The devices some container's processes are on: a device whose family has none
        # is split by size without a look at each usage (nor a `Holder` made and hashed).
        used_on = {u.device_id for u in snapshot.container_usage if u.owner is not None}
        self._cycles += 1
        cycle = self._cycles if self.linger >= 0 else -1  # (a negative linger: never kept)
        for device_id, joined in metered.items():
            account = self._accounts.setdefault(device_id, _Account())
            if account.last_reading is not None:  # an interval since the last cycle
                previous = self._holders.get(device_id, {})
                account.add(self._shares(snapshot, joined, previous, sizes, used_on))
            self._settle(account, readings[device_id])
            # Holder's hash is Python code: dicts and sets built from a dict reuse the hashes
            # it stored, so every holder is marked seen, and the new ones given a total,
            # without hashing one again (the order of `totals` is never read: `_series` sorts).
            members = holders.get(device_id, {})
            present: dict[Holder | None, float] = dict.fromkeys(members, now)
            present[None] = now
            account.seen.update(present)
            last = account.members
            if last is not None and last[0] is members and last[1] == cycle - 1:
                account.members = (members, cycle)
                continue  # the same holders as last cycle, all given a total then and kept
            account.members = (members, cycle)
            for holder in set(present).difference(account.totals):
                account.totals[holder] = 0.0
                account.series = None
        self._holders = holders
        if len(self._by_size) > len(metered):  # a device gone: its split goes with it
            self._by_size = {k: v for k, v in self._by_size.items() if k in metered}
        if len(self._whole) > len(metered):
            self._whole = {k: v for k, v in self._whole.items() if k in metered}
        return self._series(now)

    def _family_holders(
        self, snapshot: Snapshot, metered: Mapping[str, JoinedDevice]
    ) -> dict[str, dict[Holder, set[str]]]:
        key = (
            tuple(metered),
            tuple(j.reading.device for j in snapshot.devices),
            snapshot.allocations,
        )
        if self._families is not None and self._families[0] == key:
            return self._families[1]
        holders = _family_holders(snapshot, metered)
        self._families = (key, holders)
        return holders

    def _shares(
        self,
        snapshot: Snapshot,
        joined: JoinedDevice,
        previous: Mapping[Holder, set[str]],
        sizes: _SliceSizes,
        used_on: set[str],
    ) -> _Shares:
        """This cycle's shares (summing to 1) among the holders at the interval's start:
        by measured use when any of them used the device, else by what each holds.
        `used_on`: the devices with a container's usage this cycle."""
        if not previous:
            return _NOBODY
        device_id = joined.reading.device.id
        if len(previous) == 1:
            whole = self._whole.get(device_id)
            if whole is None or whole[0] is not previous:
                whole = self._whole[device_id] = (previous, {next(iter(previous)): 1.0})
            return whole[1]
        used = _used(snapshot, previous, used_on)
        if used:
            return _split(used)
        of_parent = sizes.of(device_id)
        last = self._by_size.get(device_id)
        if last is not None and last[0] is previous and last[1] == of_parent:
            return last[2]
        shares = _split(
            {h: sum(of_parent.get(d, 1.0) for d in held) for h, held in previous.items()}
        )
        self._by_size[device_id] = (previous, of_parent, shares)
        return shares

    @staticmethod
    def _settle(account: _Account, reading: float) -> None:
        last, account.last_reading = account.last_reading, reading
        if last is None or reading <= last:  # first reading, no change, or a reset
            return
        pending = account.summed()
        total = sum(pending.values())
        added = reading - last
        account.series = None
        if total <= 0:
            account.totals[None] = account.totals.get(None, 0.0) + added
        else:
            for holder, share in pending.items():
                account.totals[holder] = account.totals.get(holder, 0.0) + added * share / total
        account.pending.clear()

    def _series(self, now: float) -> tuple[ContainerEnergy, ...]:
        out: list[ContainerEnergy] = []
        for device_id, account in sorted(self._accounts.items()):
            seen = account.seen
            # The oldest sighting first (a C loop): most cycles nobody lingered out.
            if seen and now - min(seen.values()) > self.linger:
                for holder in [h for h, at in seen.items() if now - at > self.linger]:
                    if not account.summed().get(holder):
                        del seen[holder]
                        account.totals.pop(holder, None)
                        account.series = None
            if not account.seen:
                del self._accounts[device_id]
                continue
            if account.series is None:
                account.series = self._device_series(device_id, account)
            out += account.series
        return tuple(out)

    @staticmethod
    def _device_series(device_id: str, account: _Account) -> tuple[ContainerEnergy, ...]:
        """One device's series: its unlabelled one first, then its holders in order."""
        out: list[ContainerEnergy] = []
        totals = account.totals
        holders, joules = tuple(totals), tuple(totals.values())
        if account.order is None or account.order[0] != holders:
            placed = [i for i, h in enumerate(holders) if h is not None]
            placed.sort(key=lambda i: _holder_order(holders[i]))
            account.order = (holders, placed)
        if None in totals:
            out.append(_new(ContainerEnergy, (device_id, None, totals[None])))
        out += [_new(ContainerEnergy, (device_id, holders[i], joules[i])) for i in account.order[1]]
        return tuple(out)


def _family_holders(
    snapshot: Snapshot, metered: Mapping[str, JoinedDevice]
) -> dict[str, dict[Holder, set[str]]]:
    """Metered device -> its holders -> the devices of its family they hold (the device, or
    its slices that have no energy counter of their own)."""
    family_of: dict[str, str] = {device_id: device_id for device_id in metered}
    for joined in snapshot.devices:
        device = joined.reading.device
        if device.parent in metered and device.id not in metered:
            family_of[device.id] = device.parent
    out: dict[str, dict[Holder, set[str]]] = {}
    for alloc in snapshot.allocations:
        metered_id = family_of.get(alloc.device_id)
        if metered_id is not None:
            out.setdefault(metered_id, {}).setdefault(alloc.holder, set()).add(alloc.device_id)
    return out


def _used(
    snapshot: Snapshot, previous: Mapping[Holder, set[str]], used_on: set[str]
) -> dict[Holder, float]:
    """The utilization each holder's processes had on the device's family; empty when
    none of them used it (at once when no container's usage is on the family)."""
    family = set().union(*previous.values())
    if family.isdisjoint(used_on):
        return {}
    used: dict[Holder, float] = defaultdict(float)
    for usage in snapshot.container_usage:
        owner = usage.owner
        if owner is not None and owner.holder in previous and usage.device_id in family:
            used[owner.holder] += usage.utilization or 0.0
    return dict(used) if sum(used.values()) > 0 else {}


def _split(weights: Mapping[Holder, float]) -> _Shares:
    total = sum(weights.values())
    return {h: w / total for h, w in weights.items() if w > 0}


class _SliceSizes:
    """Slices by their memory (`hw.gpu.memory.limit`), per parent: their share of it. Read
    from the snapshot in one pass, on the first ask (only shared devices with no measured
    use ask), not once per parent."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._by_parent: dict[str, dict[str, float]] | None = None

    def of(self, parent: str) -> dict[str, float]:
        if self._by_parent is None:
            self._by_parent = {}
            for joined in self.snapshot.devices:
                device = joined.reading.device
                if not device.parent:
                    continue
                sizes = self._by_parent.setdefault(device.parent, {})
                values = joined.reading.values
                for at in joined.reading.layout.positions("hw.gpu.memory.limit"):
                    if values[at] > 0:
                        sizes[device.id] = values[at]
        return self._by_parent.get(parent, {})
