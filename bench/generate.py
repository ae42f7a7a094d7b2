"""Generated big nodes, written as scenario YAML for `simulate`:

- the bundled `dense` node (8 GPUs, 42 MIG slices, 200 pods) copied side by side, with new
  UUIDs, PCI domains and pod names per copy, so a 64-GPU node has 1,600 pods and eight times
  the series (`scenario`);
- `dense` with N more pods each holding a replica of one of its two time-sliced GPUs, their
  device plugin advertising enough replicas (`held`): a node of many small pods sharing
  GPUs, as time-slicing makes them, under the default series budget for N = 1,000."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

GPU_TAIL = "5e1a2d7c00"  # dense's GPU UUIDs end in 5e1a2d7c00NN
MIG_TAIL = "a1b2c3d4"  # and its MIG UUIDs in NNNNa1b2c3d4


def _dense() -> dict[str, Any]:
    text = (resources.files("simulator") / "scenarios" / "dense.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def _renamed(obj: Any, copy_index: int) -> Any:
    """Every GPU and MIG UUID in `obj` made unique to copy `copy_index`."""
    if isinstance(obj, str):
        return obj.replace(GPU_TAIL, f"5e1a2d7c{copy_index:02x}").replace(
            MIG_TAIL, f"a1b2c3{copy_index:02x}"
        )
    if isinstance(obj, list):
        return [_renamed(o, copy_index) for o in obj]
    if isinstance(obj, dict):
        return {k: _renamed(v, copy_index) for k, v in obj.items()}
    return obj


def generated_name(gpus: int) -> str:
    """The name of the generated node of `gpus` GPUs (its file's stem, its `node`)."""
    return f"generated-{gpus}gpu"


def scenario(gpus: int) -> dict[str, Any]:
    """A node of `gpus` GPUs (a multiple of 8) as a scenario document."""
    if gpus % 8 or not 8 <= gpus <= 64:
        raise ValueError(f"generated nodes have 8..64 GPUs in steps of 8, not {gpus}")
    dense = _dense()
    copies = gpus // 8
    nvidia = dense["nvidia"]
    doc: dict[str, Any] = {
        "node": generated_name(gpus),
        "description": f"{copies}x dense side by side: {gpus} GPUs, {200 * copies} pods",
        "kubelet": dense["kubelet"],
        "allocatable": [],
        "pods": [],
        "pod_sets": [],
        "nvidia": {
            "driver_version": nvidia["driver_version"],
            "gpu_defaults": nvidia["gpu_defaults"],
            "gpus": [],
            "xid": [],
            "faults": copy.deepcopy(nvidia.get("faults", [])),  # by GPU index: copy 0's
        },
    }
    for c in range(copies):
        doc["allocatable"] += _renamed(dense["allocatable"], c)
        for pod in _renamed(dense["pods"], c):
            doc["pods"].append({**pod, "name": f"{pod['name']}-n{c}"})
        for pod_set in dense.get("pod_sets", []):
            doc["pod_sets"].append({**pod_set, "prefix": f"{pod_set['prefix']}-n{c}"})
        for gpu in _renamed(nvidia["gpus"], c):
            gpu = dict(gpu)
            if "pci_bus_id" in gpu:  # one PCI domain per copy
                gpu["pci_bus_id"] = f"{c:04x}{str(gpu['pci_bus_id'])[4:]}"
            doc["nvidia"]["gpus"].append(gpu)
        doc["nvidia"]["xid"] += _renamed(nvidia.get("xid", []), c)
    return doc


def write(gpus: int, folder: Path) -> Path:
    path = folder / f"{generated_name(gpus)}.yaml"
    path.write_text(yaml.safe_dump(scenario(gpus), sort_keys=False))
    return path


SHARED = "nvidia.com/gpu.shared"
SHARED_GPUS = (
    "GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0006",
    "GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0007",
)
"""dense's two time-sliced GPUs (4 replicas each, 3 of them held by dense's own pods)."""


HELD_PODS = 1_000
"""`make bench`'s many-pods row: `dense` and this many pods more, set against `dense`."""


def held_name(pods: int = HELD_PODS) -> str:
    """The node's name, its scenario file's stem and its row's label in the report."""
    return f"dense-{pods}pods"


def held(pods: int) -> dict[str, Any]:
    """`dense` and `pods` pods more, each holding one replica of a time-sliced GPU."""
    doc = _dense()
    replicas = 4 + -(-pods // len(SHARED_GPUS))
    doc["node"] = held_name(pods)
    doc["description"] = f"dense and {pods} pods more, each holding a time-sliced GPU replica"
    for entry in doc["allocatable"]:
        if entry["resource"] == SHARED:
            gpu = str(entry["ids"][0]).split("::")[0]
            entry["ids"] = [f"{gpu}::{r}" for r in range(replicas)]
    for k in range(pods):
        gpu = SHARED_GPUS[k % len(SHARED_GPUS)]
        device = {"resource": SHARED, "ids": [f"{gpu}::{4 + k // len(SHARED_GPUS)}"], "numa": [1]}
        container = {"name": "main", "devices": [device]}
        doc["pods"].append(
            {"name": f"held-{k:04d}", "namespace": "shared", "containers": [container]}
        )
    return doc


def write_held(pods: int, folder: Path) -> Path:
    path = folder / f"{held_name(pods)}.yaml"
    path.write_text(yaml.safe_dump(held(pods), sort_keys=False))
    return path
