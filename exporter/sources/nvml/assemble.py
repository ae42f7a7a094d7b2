"""One cycle of the NVML source, GPU by GPU: a GPU's values and its MIG slices', with their
status and XIDs, as readings whose layouts are kept from cycle to cycle.

What a device's reading holds is the same cycle after cycle, so each device keeps the
`Layout` of its last reading (`Layouts`) and only the values are new; a MIG slice with
nothing to say beyond its memory, status and last XID (most slices of a dense node) takes
one layout made once, without a list of keys.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.model import Device, DeviceReading, Key, Layout, ProcessUsage, Sample
from exporter.sources.nvml.calls import Calls, GpuLost
from exporter.sources.nvml.discovery import Gpu, devices
from exporter.sources.nvml.readings import Reader, memory_keys, put_samples
from exporter.sources.nvml.xid import last_xid

_new = tuple.__new__
"""`_new(DeviceReading, (device, layout, values))`: no Python-level `__new__`."""
STATES = ("ok", "degraded", "failed")
_STATUS = {
    state: tuple(Sample("hw.status", float(s == state), (("hw.state", s),)) for s in STATES)
    for state in STATES
}
STATUS_KEYS: tuple[Key, ...] = tuple(("hw.status", (("hw.state", s),)) for s in STATES)
STATUS_VALUES = {state: tuple(float(s == state) for s in STATES) for state in STATES}
"""A device's status as keys and, per state, values."""


def status(state: str) -> tuple[Sample, ...]:
    """The status samples of a device in `state` (built once: samples are immutable)."""
    return _STATUS[state]


class Layouts:
    """Each device's last layout: a reading whose keys are the last cycle's (compared
    element by element, the keys being the same objects) takes the same `Layout`."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[list[Key], Layout]] = {}

    def reading(self, device: Device, keys: list[Key], values: list[float]) -> DeviceReading:
        last = self._last.get(device.id)
        if last is None or last[0] != keys:
            last = self._last[device.id] = (keys, Layout.of(tuple(keys)))
        reading: DeviceReading = _new(DeviceReading, (device, last[1], tuple(values)))
        return reading

    def keep(self, device_ids: set[str]) -> None:
        """Forget the devices not in `device_ids` (a new MIG layout's slices are new)."""
        for gone in self._last.keys() - device_ids:
            del self._last[gone]


_LAST_XID: Key = ("hw.gpu.xid.last", ())
_PLAIN_SLICE = Layout.of((*memory_keys((0.0,) * 4), *STATUS_KEYS, _LAST_XID))
"""A MIG slice's reading with its memory (v2), its status and its last XID, nothing more."""


class CycleReadings:
    """The readings of one cycle (`read_gpu`, after `begin`), and what they keep between
    cycles: each device's layout, each GPU's family (for its last XID)."""

    def __init__(
        self, reader: Reader, calls: Calls, clock: Callable[[], float], *, processes: bool
    ) -> None:
        self.reader = reader
        self.calls = calls
        self.clock = clock
        self.processes = processes
        self.layouts = Layouts()
        self._xid_keys: dict[int, Key] = {}
        self._xids_by_device: dict[str, tuple[list[Key], list[float]]] = {}
        self._last_xids: dict[str, float] = {}
        self._events = False
        self._family: dict[str, str] = {}
        """Device -> its GPU (itself for a GPU), as of the last discovery."""

    def discovered(self, gpus: list[Gpu]) -> None:
        self.layouts.keep({d.device.id for d in devices(gpus)})
        self._family = {g.device.id: g.device.id for g in gpus}
        self._family.update((m.device.id, g.device.id) for g in gpus for m in g.migs)

    def begin(
        self,
        counts: dict[tuple[str, int], int],
        latest: dict[str, tuple[int, int]],
        *,
        events: bool,
    ) -> None:
        """A cycle with these XID counts and latest events (`XidCounts`); `events`: the
        event set is registered (without it, no last XID is reported)."""
        self._events = events
        self._xids_by_device = self._group_xids(counts)
        self._last_xids = self._latest_per_gpu(latest)

    def read_gpu(
        self, gpu: Gpu, readings: list[DeviceReading], processes: list[ProcessUsage]
    ) -> None:
        """The GPU's reading and its slices', and their processes; each of them failed when
        the GPU is lost."""
        reader, layouts = self.reader, self.layouts
        gpu.slow_now = reader.slow_due(gpu)
        if gpu.slow_now:
            gpu.slow_read_at = self.clock()
        try:
            keys: list[Key] = []
            values: list[float] = []
            degraded = reader.gpu_values(gpu, keys, values)
            last_xid = self._last_xid(gpu)
            migs = self._read_migs(gpu, last_xid, processes) if gpu.migs else []
            if self.processes and not gpu.mig_mode:
                for pid, memory, util in reader.procs.read(
                    gpu.device.id, gpu.handle, gpu, slow=gpu.slow_now
                ):
                    processes.append(ProcessUsage(gpu.device.id, pid, memory, util))
        except GpuLost:
            self.calls.stale = True  # rediscover: the GPU may be back, or gone for good
            readings.append(DeviceReading(gpu.device, status("failed")))
            readings += [DeviceReading(m.device, status("failed")) for m in gpu.migs]
            return
        self._tail(gpu.device.id, "degraded" if degraded else "ok", last_xid, keys, values)
        readings.append(layouts.reading(gpu.device, keys, values))
        readings += migs

    def _read_migs(
        self, gpu: Gpu, last_xid: float | None, processes: list[ProcessUsage]
    ) -> list[DeviceReading]:
        """The GPU's MIG slices. Most have nothing to say beyond their memory, status and
        last XID: they take that one layout, made once, without a list of keys. In a cycle
        where no slice has GPM activity to report or a GPM call due (`Reader.gpm_quiet`),
        their memory is read in one call for them all (`Direct.memories`: the same C calls
        in the same order)."""
        reader, xids = self.reader, self._xids_by_device
        tail = None if last_xid is None else (*STATUS_VALUES["ok"], last_xid)
        out: list[DeviceReading] = []
        put = out.append
        quiet = reader.gpm_quiet(gpu)
        memories = reader.direct.memories([mig.handle for mig in gpu.migs]) if quiet else None
        memory, mig_gpm = reader.direct.memory, reader.mig_gpm
        for at, mig in enumerate(gpu.migs):
            device = mig.device
            mem = memory(mig.handle) if memories is None else memories[at]
            gpm = None if quiet or mig.gpm is None else mig_gpm(gpu, mig)
            if tail and not gpm and mem and len(mem) == 4 and device.id not in xids:
                put(_new(DeviceReading, (device, _PLAIN_SLICE, mem + tail)))
            else:
                put(self._slice_reading(device, mem, gpm, last_xid))
        if self.processes:
            reader.procs.slices(gpu, processes)
        return out

    def _slice_reading(
        self,
        device: Device,
        mem: tuple[float, ...] | None,
        gpm: list[Sample] | None,
        last_xid: float | None,
    ) -> DeviceReading:
        keys: list[Key] = []
        values: list[float] = []
        if mem:
            keys += memory_keys(mem)
            values += mem
        if gpm:
            put_samples(gpm, keys, values)
        self._tail(device.id, "ok", last_xid, keys, values)
        return self.layouts.reading(device, keys, values)

    def _tail(
        self,
        device_id: str,
        state: str,
        last_xid: float | None,
        keys: list[Key],
        values: list[float],
    ) -> None:
        """What every device's reading ends with: its status, its XIDs, the last XID."""
        keys += STATUS_KEYS
        values += STATUS_VALUES[state]
        xids = self._xids_by_device.get(device_id)
        if xids is not None:
            keys += xids[0]
            values += xids[1]
        if last_xid is not None:
            keys.append(_LAST_XID)
            values.append(last_xid)

    def _group_xids(
        self, counts: dict[tuple[str, int], int]
    ) -> dict[str, tuple[list[Key], list[float]]]:
        """This cycle's XID counts as keys and values, per device (once, not per device)."""
        found: dict[str, tuple[list[Key], list[float]]] = {}
        for (dev, xid), n in sorted(counts.items()):
            key = self._xid_keys.get(xid)
            if key is None:
                key = self._xid_keys[xid] = ("hw.gpu.xid.errors", (("hw.gpu.xid", str(xid)),))
            keys, values = found.setdefault(dev, ([], []))
            keys.append(key)
            values.append(float(n))
        return found

    def _last_xid(self, gpu: Gpu) -> float | None:
        """The last XID of the GPU or any of its slices, on the GPU and on each slice (DCGM's
        XID field is the GPU's), while the event set is registered: without it, none."""
        if not self._events:
            return None
        return self._last_xids.get(gpu.device.id, 0.0)

    def _latest_per_gpu(self, latest: dict[str, tuple[int, int]]) -> dict[str, float]:
        """Per GPU: the XID of the latest event on it or any of its slices (`xid.last_xid`),
        for the GPUs that had one; a pass over the devices with events, not over all."""
        if not latest:
            return {}
        family = self._family
        members: dict[str, list[str]] = {}
        for device_id in latest:
            gpu_id = family.get(device_id)
            if gpu_id is not None:
                members.setdefault(gpu_id, []).append(device_id)
        return {gpu_id: float(last_xid(latest, ids)) for gpu_id, ids in members.items()}
