"""Discovery: GPU handles, identities and the MIG layout, cached between rediscoveries.

Read through handles only, but for one privileged call per MIG device: its GPU instance's
placement (behaviour.py `gpu-instance-by-id-privileged`), which is how a partition a DRA
driver created at prepare is told from its siblings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml

from exporter.ids import mig_placement_key, normalize_device_id, pci_address
from exporter.model import Device
from exporter.sources.nvml.calls import Calls, text
from exporter.sources.nvml.gpm import Gpm, allocate

SOURCE = "nvml"


@dataclass(slots=True)
class Mig:
    handle: Any
    device: Device
    gi: int
    ci: int
    gpm: Gpm | None = None


@dataclass(slots=True)
class Gpu:
    handle: Any
    index: int
    device: Device
    mig_mode: bool
    migs: list[Mig] = field(default_factory=list)
    empty_slots: tuple[int, ...] = ()
    """MIG slots that held no device at discovery: one that answers a handle later is a
    slice made since (a DRA driver makes one at prepare, the MIG mode unchanged)."""
    gpm: Gpm | None = None
    process_seen_us: int = 0
    slow_read_at: float = -math.inf
    """When the slow values (see fields.FIELDS) were last read."""
    slow_now: bool = True
    """Whether this cycle reads them."""


def devices(gpus: Iterable[Gpu]) -> Iterator[Gpu | Mig]:
    for gpu in gpus:
        yield gpu
        yield from gpu.migs


def _aliases(*ids: str) -> frozenset[str]:
    return frozenset(normalize_device_id(i)[0] for i in ids if i)


def mig_mode(calls: Calls, handle: Any) -> bool:
    mode = calls.get(pynvml.nvmlDeviceGetMigMode, handle, handle=True)
    return bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE


class Discovery:
    """Describes the GPUs behind indices 0..count-1; GPM buffers are handed over between
    rediscoveries so a device's activity has no gap."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.gpm_pool: dict[str, Gpm] = {}
        self.no_gpm: dict[str, str] = {}
        """GPUs found without GPM, and why (each said once)."""
        self._unsaid: list[Gpu] = []
        self.forbidden: set[int] = set()
        """Indices whose handle answered NO_PERMISSION (not in this container)."""

    def gpu(self, index: int, driver: str) -> Gpu | None:
        get = self.calls.get
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NO_PERMISSION:
                if index not in self.forbidden:
                    self.forbidden.add(index)
                    self.calls.log.info(
                        "GPU %d is not accessible from this pod (NO_PERMISSION): skipped", index
                    )
                return None
            self.calls.interpret(exc, "nvmlDeviceGetHandleByIndex")
            return None
        uuid = text(get(pynvml.nvmlDeviceGetUUID, handle) or "")
        if not uuid:
            return None
        name = text(get(pynvml.nvmlDeviceGetName, handle) or "")
        pci = get(pynvml.nvmlDeviceGetPciInfo, handle)
        bus_id = (pci_address(text(pci.busId)) or "") if pci is not None else ""
        minor = get(pynvml.nvmlDeviceGetMinorNumber, handle)
        serial = get(pynvml.nvmlDeviceGetSerial, handle)
        mig = mig_mode(self.calls, handle)
        common = (
            ("hw.gpu.index", str(index)),
            ("hw.gpu.minor", "" if minor is None else str(minor)),
            ("hw.pci.bus_id", bus_id),
            ("hw.driver_version", driver),
        )
        gke = f"nvidia{minor}" if minor is not None else ""
        device = Device(
            id=uuid,
            type="gpu",
            vendor="nvidia",
            model=name,
            source=SOURCE,
            attributes=(*common, ("hw.serial_number", text(serial or ""))),
            # NVIDIA's DRA driver names a GPU gpu-<minor> (k8s-dra-driver-gpu
            # cmd/gpu-kubelet-plugin/deviceinfo.go CanonicalName), not by NVML index.
            aliases=_aliases(uuid, gke, bus_id, f"gpu.nvidia.com/gpu-{minor}" if gke else ""),
        )
        gpu = Gpu(handle, index, device, mig)
        gpm_supported = self.gpm_supported(gpu)
        if gpm_supported:
            gpu.gpm = self.take_gpm(uuid)
        if mig:
            gpu.migs, gpu.empty_slots = self.migs(gpu, common, gke, gpm_supported)
        return gpu

    def migs(
        self, gpu: Gpu, common: tuple[tuple[str, str], ...], gke: str, gpm: bool
    ) -> tuple[list[Mig], tuple[int, ...]]:
        """The MIG devices of a GPU in MIG mode, and the slots that hold none."""
        get = self.calls.get
        slots = get(pynvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0
        found = []
        empty = []
        for slot in range(slots):
            handle = get(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                gpu.handle,
                slot,
                quiet=(pynvml.NVML_ERROR_NOT_FOUND,),
            )
            if handle is None:
                empty.append(slot)
                continue
            uuid = text(get(pynvml.nvmlDeviceGetUUID, handle) or "")
            name = text(get(pynvml.nvmlDeviceGetName, handle) or "")
            gi = get(pynvml.nvmlDeviceGetGpuInstanceId, handle)
            ci = get(pynvml.nvmlDeviceGetComputeInstanceId, handle)
            if not uuid or gi is None or ci is None:
                continue
            profile = name.rsplit(" MIG ", 1)[1] if " MIG " in name else ""
            placement = self.placement(gpu.handle, gi)
            where = mig_placement_key(gpu.device.id, *placement) if placement else ""
            device = Device(
                id=uuid,
                type="gpu",
                vendor="nvidia",
                model=name,
                source=SOURCE,
                parent=gpu.device.id,
                attributes=(
                    *common,
                    ("hw.gpu.mig.profile", profile),
                    ("hw.gpu.mig.gpu_instance_id", str(gi)),
                    ("hw.gpu.mig.compute_instance_id", str(ci)),
                ),
                aliases=_aliases(
                    uuid, f"MIG-{gpu.device.id}/{gi}/{ci}", f"{gke}/gi{gi}" if gke else "", where
                ),
            )
            found.append(Mig(handle, device, gi, ci, self.take_gpm(uuid) if gpm else None))
        return found, tuple(empty)

    def placement(self, parent: Any, gi: int) -> tuple[int, int] | None:
        """(GPU instance profile ID, placement start) of GPU instance `gi`, as NVIDIA's DRA
        driver reads it to find the MIG device it made (dra-driver-nvidia-gpu
        cmd/gpu-kubelet-plugin/nvlib.go `FindMigDevBySpec`); None where this pod may not ask
        (NO_PERMISSION, said once by Calls) or the driver cannot say."""
        instance = self.calls.get(pynvml.nvmlDeviceGetGpuInstanceById, parent, gi)
        if instance is None:
            return None
        info = self.calls.get(pynvml.nvmlGpuInstanceGetInfo, instance)
        if info is None:
            return None
        return int(info.profileId), int(info.placement.start)

    def new_slice(self, gpu: Gpu) -> bool:
        """Whether a slot empty at discovery holds a MIG device now (one call per empty
        slot; NOT_FOUND is the usual answer)."""
        return any(
            self.calls.get(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                gpu.handle,
                slot,
                quiet=(pynvml.NVML_ERROR_NOT_FOUND,),
            )
            is not None
            for slot in gpu.empty_slots
        )

    def gpm_supported(self, gpu: Gpu) -> bool:
        """Whether GPM (Hopper and later) works on this GPU; a GPU or driver without it has
        no profiling series (not a failure), said once: see `say_no_gpm`."""
        support = self.calls.get(pynvml.nvmlGpmQueryDeviceSupport, gpu.handle)
        if support is not None and support.isSupportedDevice:
            return True
        if gpu.device.id not in self.no_gpm:
            self.no_gpm[gpu.device.id] = (
                "no GPM in this driver" if support is None else "GPM needs Hopper or later"
            )
            self._unsaid.append(gpu)
        return False

    def say_no_gpm(self) -> None:
        """One log line for the GPUs a discovery found without GPM, each GPU said once."""
        if not self._unsaid:
            return
        gpus = ", ".join(f"{g.index} ({g.device.model})" for g in self._unsaid)
        reasons = sorted({self.no_gpm[g.device.id] for g in self._unsaid})
        self.calls.log.info(
            "GPUs without GPM (%s): %s; no profiling metrics (SM, tensor, DRAM activity) for them",
            "; ".join(reasons),
            gpus,
        )
        self._unsaid = []

    def take_gpm(self, device_id: str) -> Gpm | None:
        """The device's GPM buffers from before a rediscovery, or new ones."""
        kept = self.gpm_pool.pop(device_id, None)
        return kept if kept is not None else allocate(self.calls)
