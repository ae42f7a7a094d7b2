"""NVIDIA GPUs and MIG slices through NVML (nvidia-ml-py): the only package that imports
pynvml, and one source to the rest of the exporter.

- `behaviour.py`: each NVML behaviour the source relies on, with its nvml.h passage;
- `calls.py`: the one place NVML return codes are interpreted;
- `discovery.py`: handles, identities and the MIG layout (cached);
- `readings.py`: what one cycle reads of a device (batched field values, GPM);
- `processes.py`: the process lists and utilization samples;
- `direct.py`, `structs.py`: the per-cycle calls, straight to the C functions;
- `assemble.py`: one cycle's readings, each device's layout kept between cycles;
- `gpm.py`: GPM sample buffers (Hopper and later);
- `xid.py`: XID events, from an event set each cycle empties;
- `source.py`: lifecycle: init, absent hardware, rediscovery, lost GPUs, restart.
"""

from exporter.sources.nvml.calls import NvmlUnavailable
from exporter.sources.nvml.discovery import SOURCE
from exporter.sources.nvml.source import NvmlSource

__all__ = ["SOURCE", "NvmlSource", "NvmlUnavailable"]
