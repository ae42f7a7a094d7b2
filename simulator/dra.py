"""The `dra:` section: the node's ResourceSlices, device taints, DeviceTaintRules and claim
health, served by a loopback API server (apiserver.py) with the scenario's pods.

```yaml
dra:
  taint_rules_served: true      # DeviceTaintRule is v1beta2, off by default in 1.36
  slices:                       # resource.k8s.io/v1 ResourceSlice specs (nodeName is added)
    - {driver: gpu.nvidia.com, pool: {name: node-1, generation: 1, resourceSliceCount: 1},
       devices: [...], sharedCounters: [...]}
  taints:                       # a taint the driver puts on one device of its slice
    - {device: gpu.nvidia.com/node-1/gpu-0, key: ..., value: ..., effect: NoExecute, start: 10}
  taint_rules:                  # resource.k8s.io/v1beta2 DeviceTaintRules
    - {name: ..., selector: {driver: ..., device: ...}, taint: {key:, effect:}, start: 0}
  health:                       # what the kubelet puts in allocatedResourcesStatus
    - {pod: NS/NAME, device: DRIVER/POOL/DEVICE, health: Unhealthy, message: ..., start: 5}
  templated:                    # claims made from a ResourceClaimTemplate: NS/CLAIM -> the
    ml-team/trainer-0-gpu-7xk2p: gpu  # pod's reference to it (spec.resourceClaims[].name)
  extended:                     # claims the scheduler made for an extended resource a
    ml-team/ext-0-extended-resources-4x7kq: example.com/gpu  # DeviceClass serves (KEP-5004)
  claims:                       # what a ResourceClaim says beyond PodResources
    serving/infer-a-gpu: {consumed: {memory: 20Gi}}         # consumedCapacity per result
    monitoring/dcgm-gpus: {admin: true}                     # adminAccess: true
    ml-team/nic: {devices: [{device: DRIVER/POOL/DEVICE, conditions: [...], networkData: {...}}]}
```

Every claim a pod of the scenario lists is served as a `resource.k8s.io/v1` ResourceClaim
(GET by namespace and name, as the exporter reads them): its `status.allocation` has one
result per device the pods list (`request` the pod's reference to it, `gpu` for one made
beforehand, `container-<i>-request-0` for an extended one, whose devices go to its
containers in turn, as the real scheduler gave `gpu-0` to container 0 and `gpu-1` to
container 1), with the share ID PodResources lists and what `claims:` adds; its
`status.devices` is what `claims:` gives (KEP-4817, shapes of control-plane.md fact 15).

An `extended` claim is what the real 1.36 cluster made for a pod asking for
`example.com/gpu` in its limits (tests/test_real_cluster_dra_extended.py, docs/dra.md): the
pod names no claim (`spec.resourceClaims` empty), its status says
`extendedResourceClaimStatus: {resourceClaimName: <claim>, requestMappings: [{containerName,
resourceName, requestName: container-<i>-request-0}]}` for each container holding it (the
scenario lists the whole claim under each, as the kubelet's List does,
`GetContainerClaimInfos` in pkg/kubelet/cm/dra/manager.go), the container asks for as many
of the resource as the claim lists devices, and no `allocatedResourcesStatus` entry is
written for it (`UpdateAllocatedResourcesStatus` skips containers with no
`resources.claims`; seen on the real cluster too).

Every container holding a claim gets `allocatedResourcesStatus` entries named
`claim:<reference>`, the pod's own name for the claim, not the ResourceClaim's (the real 1.36
kubelet wrote `claim:gpu` for the claim PodResources lists as `trainer-gpu-9dfhr`,
tests/test_real_cluster_dra_driver.py). A `templated` claim's reference is resolved in the
pod's `status.resourceClaimStatuses` (`{name: <reference>, resourceClaimName: <claim>}`) and
its `spec.resourceClaims` names the template; any other claim is referenced by its own name
(`spec.resourceClaims: [{name: <claim>, resourceClaimName: <claim>}]`). Each entry has one
resource per claimed device (`resourceID` is `driver/pool/device`,
control-plane.md DRA item 5); a device no `health:` entry covers reads `Unknown`, what the
1.36 kubelet reports before a driver's health stream says anything (and after it stops,
control-plane.md DRA item 6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporter.model import ClaimResource
from simulator.apiserver import ApiServer
from simulator.scenario import Scenario, ScenarioError
from simulator.scenario_model import TimedPod


def _active(entry: dict[str, Any], t: float) -> bool:
    start = float(entry.get("start", 0) or 0)
    end = entry.get("end")
    return start <= t and (end is None or t < float(end))


class DraPart:
    def __init__(self, scenario: Scenario, workdir: Path) -> None:
        doc = scenario.sections.get("dra") or {}
        if not isinstance(doc, dict):
            raise ScenarioError(f"{scenario.name}: dra: must be a mapping")
        self.scenario = scenario
        self.doc = doc
        self.api = ApiServer(serve_taint_rules=bool(doc.get("taint_rules_served", False)))
        self.api.start()
        self.kubeconfig = self.api.kubeconfig(workdir / "dra-kubeconfig")
        self._sent: dict[str, dict[str, str]] = {
            r: {} for r in ("pods", "resourceslices", "devicetaintrules", "resourceclaims")
        }
        self.advance(0.0)

    def env(self) -> dict[str, str]:
        return {}

    def exporter_args(self) -> list[str]:
        return [
            "--kubernetes.api",
            "--kubernetes.dra",
            "--kubernetes.kubeconfig",
            str(self.kubeconfig),
        ]

    def close(self) -> None:
        self.api.stop()

    def advance(self, t: float) -> None:
        self._sync("resourceslices", self._slices(t))
        self._sync("devicetaintrules", self._rules(t))
        self._sync("pods", [self._pod(p, t) for p in self.scenario.listed_at(t)])
        self._sync("resourceclaims", self._claims(t))

    def _sync(self, resource: str, objects: list[dict[str, Any]]) -> None:
        """Put what changed, delete what is gone: watchers see only real changes."""
        sent = self._sent[resource]
        now = {}
        for obj in objects:
            key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
            text = json.dumps(obj, sort_keys=True)
            now[key] = text
            if sent.get(key) != text:
                self.api.put(resource, obj)
        for key, text in sent.items():
            if key not in now:
                self.api.delete(resource, json.loads(text))
        self._sent[resource] = now

    def _slices(self, t: float) -> list[dict[str, Any]]:
        taints = [x for x in self.doc.get("taints") or () if _active(x, t)]
        out = []
        for i, spec in enumerate(self.doc.get("slices") or ()):
            spec = json.loads(json.dumps(spec))
            if spec.get("sharedCounters") and spec.get("devices"):
                # What the real 1.36 API server answers (422) to such a slice.
                raise ScenarioError(
                    f"{self.scenario.name}: dra.slices[{i}]: only one of `sharedCounters` or "
                    "`devices` is allowed in a ResourceSlice (Kubernetes 1.36)"
                )
            spec["nodeName"] = self.scenario.node
            pool = spec.setdefault(
                "pool", {"name": self.scenario.node, "generation": 1, "resourceSliceCount": 1}
            )
            for device in spec.get("devices") or ():
                key = f"{spec['driver']}/{pool['name']}/{device['name']}"
                added = [
                    {k: x[k] for k in ("key", "value", "effect") if k in x}
                    | {"timeAdded": "2026-01-01T00:00:00Z"}
                    for x in taints
                    if x.get("device") == key
                ]
                if added:
                    device["taints"] = [*(device.get("taints") or ()), *added]
            name = f"{self.scenario.node}-{spec['driver']}-{i}"
            out.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": name, "uid": f"uid-slice-{i}"},
                    "spec": spec,
                }
            )
        return out

    def _rules(self, t: float) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "resource.k8s.io/v1beta2",
                "kind": "DeviceTaintRule",
                "metadata": {"name": r["name"], "uid": f"uid-rule-{r['name']}"},
                "spec": {"deviceSelector": r.get("selector") or {}, "taint": r["taint"]},
            }
            for r in self.doc.get("taint_rules") or ()
            if _active(r, t)
        ]

    def _pod(self, timed: TimedPod, t: float) -> dict[str, Any]:
        pod = timed.pod
        health = [h for h in self.doc.get("health") or () if _active(h, t)]
        templated = self.doc.get("templated") or {}
        extended = self.doc.get("extended") or {}
        refs: dict[str, str] = {}  # claim -> the pod's reference to it
        statuses = []
        containers: list[dict[str, Any]] = []
        mappings: list[dict[str, str]] = []
        extended_claim = ""
        for index, c in enumerate(pod.containers):
            status: dict[str, Any] = {"name": c.name, "ready": True, "restartCount": 0}
            containers.append({"name": c.name, "image": "sim"})
            entries = []
            for claim in c.dynamic_resources:
                resource = str(extended.get(f"{claim.claim_namespace}/{claim.claim_name}", ""))
                if resource:
                    extended_claim = claim.claim_name
                    count = str(len(claim.claim_resources))
                    containers[-1]["resources"] = {"limits": {resource: count}}
                    mappings.append({"containerName": c.name, "resourceName": resource,
                                     "requestName": f"container-{index}-request-0"})  # fmt: skip
                    continue
                resources = []
                for r in claim.claim_resources:
                    rid = f"{r.driver_name}/{r.pool_name}/{r.device_name}"
                    said = [
                        h
                        for h in health
                        if h.get("pod") == f"{pod.namespace}/{pod.name}" and h.get("device") == rid
                    ]
                    res = {"resourceID": rid, "health": "Unknown"}
                    if said:
                        res["health"] = str(said[-1].get("health", "Unknown"))
                        if said[-1].get("message"):
                            res["message"] = str(said[-1]["message"])
                    resources.append(res)
                ref = str(templated.get(f"{claim.claim_namespace}/{claim.claim_name}", ""))
                refs[claim.claim_name] = ref or claim.claim_name
                entries.append({"name": f"claim:{refs[claim.claim_name]}", "resources": resources})
            if entries:
                status["allocatedResourcesStatus"] = entries
            statuses.append(status)
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": f"uid-{pod.namespace}-{pod.name}",
                "labels": {},
            },
            "spec": {
                "nodeName": self.scenario.node,
                "containers": containers,
                "resourceClaims": [
                    {"name": ref, "resourceClaimTemplateName": ref}
                    if ref != claim
                    else {"name": ref, "resourceClaimName": claim}
                    for claim, ref in refs.items()
                ],
            },
            "status": {
                "phase": "Running",
                "containerStatuses": statuses,
                "resourceClaimStatuses": [
                    {"name": ref, "resourceClaimName": claim}
                    for claim, ref in refs.items()
                    if ref != claim
                ],
            },
        }
        if extended_claim:
            obj["status"]["extendedResourceClaimStatus"] = {
                "requestMappings": mappings,
                "resourceClaimName": extended_claim,
            }
        return obj

    def _claims(self, t: float) -> list[dict[str, Any]]:
        """The ResourceClaims the listed pods hold (module docstring)."""
        conf = self.doc.get("claims") or {}
        extended = self.doc.get("extended") or {}
        templated = self.doc.get("templated") or {}
        listed: dict[str, list[tuple[int, ClaimResource]]] = {}
        for timed in self.scenario.listed_at(t):
            for index, c in enumerate(timed.pod.containers):
                for claim in c.dynamic_resources:
                    key = f"{claim.claim_namespace}/{claim.claim_name}"
                    entries = listed.setdefault(key, [])
                    entries += [(index, r) for r in claim.claim_resources
                                if r not in [e[1] for e in entries]]  # fmt: skip
        out = []
        for key, entries in sorted(listed.items()):
            namespace, name = key.split("/", 1)
            extra = conf.get(key) or {}
            containers = sorted({i for i, _ in entries})
            results = []
            for j, (_, r) in enumerate(entries):
                if key in extended:
                    request = f"container-{containers[j % len(containers)]}-request-0"
                else:
                    request = str(templated.get(key) or "gpu")
                result: dict[str, Any] = {"request": request, "driver": r.driver_name,
                                          "pool": r.pool_name, "device": r.device_name}  # fmt: skip
                if r.share_id:
                    result["shareID"] = r.share_id
                if extra.get("admin"):
                    result["adminAccess"] = True
                if extra.get("consumed"):
                    result["consumedCapacity"] = dict(extra["consumed"])
                results.append(result)
            status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
            if extra.get("devices"):
                status["devices"] = [_device_status(d) for d in extra["devices"]]
            out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name, "namespace": namespace,
                                     "uid": f"uid-claim-{namespace}-{name}"},
                        "spec": {"devices": {"requests": [
                            {"name": r, "exactly": {"deviceClassName": "sim",
                                                    "adminAccess": bool(extra.get("admin"))}}
                            for r in sorted({x["request"] for x in results})]}},
                        "status": status})  # fmt: skip
        return out


def _device_status(entry: dict[str, Any]) -> dict[str, Any]:
    """A `claims: devices:` entry (`device: DRIVER/POOL/DEVICE`) as `status.devices[]`."""
    driver, pool, device = str(entry["device"]).split("/", 2)
    return {"driver": driver, "pool": pool, "device": device,
            **{k: v for k, v in entry.items() if k != "device"}}  # fmt: skip


def make_part(scenario: Scenario, workdir: Path) -> DraPart:
    return DraPart(scenario, workdir)
