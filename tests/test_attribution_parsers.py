"""The cgroup and /var/log/containers parsers: every runtime, driver and version form,
and hostile input (nothing raises, nothing is attributed to the wrong pod)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.cgroup import CgroupIdentity, parse_cgroup_file, parse_cgroup_path
from exporter.attribution.containerlogs import ContainerName, index_names, parse_log_name

UID = "8c1e2f3a-4b5c-4d6e-8f70-123456789abc"
UID_ = UID.replace("-", "_")
STATIC_UID = "0f3a9c2b7d1e4f5a6b7c8d9e0f1a2b3c"
CID = "3f2a" + "0123456789abcdef" * 3 + "9b8c7d6e5f4a3b2c"[:12]
OTHER = "b" * 64

assert len(CID) == 64

CGROUP_FORMS = [
    # cgroup v2, systemd driver, containerd: QoS burstable, besteffort, guaranteed
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    # systemd + CRI-O, and CRI-O's monitor (not the container)
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"crio-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"crio-conmon-{CID}.scope",
        CgroupIdentity(UID, ""),
    ),
    # systemd + Docker (cri-dockerd)
    (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    # cgroupfs driver: containerd/Docker (bare ID) and CRI-O (crio-<id>)
    (f"0::/kubepods/burstable/pod{UID}/{CID}", CgroupIdentity(UID, CID)),
    (f"0::/kubepods/besteffort/pod{UID}/{CID}", CgroupIdentity(UID, CID)),
    (f"0::/kubepods/pod{UID}/{CID}", CgroupIdentity(UID, CID)),
    (f"0::/kubepods/burstable/pod{UID}/crio-{CID}", CgroupIdentity(UID, CID)),
    # static pods: a 32-hex UID
    (f"0::/kubepods/burstable/pod{STATIC_UID}/{CID}", CgroupIdentity(STATIC_UID, CID)),
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
        f"cri-containerd-{CID}.scope",
        CgroupIdentity(STATIC_UID, CID),
    ),
    # read from inside a cgroup namespace
    (
        f"0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID),
    ),
    (f"0::/../../../besteffort/pod{UID}/{CID}", CgroupIdentity(UID, CID)),
    (f"0::/../pod{UID}/{CID}", CgroupIdentity(UID, CID)),
    # a sibling in the reader's own pod: no pod component visible
    (f"0::/../cri-containerd-{CID}.scope", CgroupIdentity("", CID)),
    (f"0::/../{CID}", CgroupIdentity("", CID)),
    # nested cgroups below the container (systemd or a runtime inside the container)
    (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope",
        CgroupIdentity(UID, CID),
    ),
    # the pod's own cgroup (no container below)
    (f"0::/kubepods/burstable/pod{UID}", CgroupIdentity(UID, "")),
    # cgroup v1: every hierarchy agrees; one controller shows only the pod
    (
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"11:devices:/kubepods/burstable/pod{UID}/{CID}\n"
        f"5:rdma:/kubepods/burstable/pod{UID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
        CgroupIdentity(UID, CID),
    ),
    (
        f"11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}"
        f".slice/docker-{CID}.scope\n"
        f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}"
        f".slice/docker-{CID}.scope\n"
        "0::/\n",
        CgroupIdentity(UID, CID),
    ),
    # hybrid: v1 hierarchies and the unified one
    (
        f"3:memory:/kubepods/pod{UID}/{CID}\n0::/kubepods/pod{UID}/{CID}\n",
        CgroupIdentity(UID, CID),
    ),
]

NOT_PODS = [
    "0::/",  # the host's init, or the reader's own cgroup namespace root
    "0::/init.scope",
    "0::/system.slice/containerd.service",
    "0::/user.slice/user-1000.slice/session-3.scope",
    f"0::/system.slice/docker-{CID}.scope",  # a Docker container, not a pod
    f"0::/docker/{CID}",
    "",
    "garbage",
    # the right shapes in the wrong places
    f"0::/mypods/pod{UID}/{CID}",
    f"0::/kubepods.slice/other-pod{UID_}.slice/cri-containerd-{CID}.scope",
    f"0::/kubepods/pod{UID.upper()}/{CID}",
    f"0::/kubepods/pod{UID}x/{CID}",
    f"0::kubepods/pod{UID}/{CID}",  # not absolute
    f"0::/kubepods/../pod{UID}/{CID}",
    # lines that disagree
    f"4:memory:/kubepods/pod{UID}/{CID}\n0::/kubepods/pod{UID}/{OTHER}\n",
    f"4:memory:/kubepods/pod{UID}/{CID}\n0::/kubepods/pod{STATIC_UID}/{CID}\n",
]


@pytest.mark.parametrize(("text", "expected"), CGROUP_FORMS)
def test_cgroup_forms(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_file(text) == expected


@pytest.mark.parametrize("text", NOT_PODS)
def test_cgroup_not_a_pod(text: str) -> None:
    assert parse_cgroup_file(text) is None


def test_container_id_is_not_a_truncation() -> None:
    assert parse_cgroup_path(f"/kubepods/pod{UID}/{CID[:63]}") == CgroupIdentity(UID, "")
    assert parse_cgroup_path(f"/kubepods/pod{UID}/cri-containerd-{CID}") == CgroupIdentity(UID, "")


_components = st.one_of(
    st.sampled_from(
        [
            "..",
            ".",
            "kubepods",
            "burstable",
            "kubepods.slice",
            "kubepods-burstable.slice",
            f"pod{UID}",
            f"kubepods-pod{UID_}.slice",
            CID,
            f"cri-containerd-{CID}.scope",
            f"crio-conmon-{CID}.scope",
            "",
        ]
    ),
    st.text(max_size=80),
)


@given(st.lists(_components, max_size=8), st.text(max_size=20))
def test_cgroup_hostile_paths_never_raise(components: list[str], head: str) -> None:
    path = "/" + "/".join(components)
    identity = parse_cgroup_path(path)
    for text in (f"0::{path}", f"{head}:{path}", path, head + path):
        parse_cgroup_file(text)
    if identity is not None:
        # Whatever it found is literally in the path, in the kubelet's or runtime's form.
        assert identity.pod_uid == "" or (
            identity.pod_uid in path or identity.pod_uid.replace("-", "_") in path
        )
        assert identity.container_id == "" or identity.container_id in path


@given(st.text(max_size=400))
def test_cgroup_hostile_files_never_raise(text: str) -> None:
    parse_cgroup_file(text)


@given(st.lists(st.sampled_from([UID, STATIC_UID]), min_size=2, max_size=4))
def test_cgroup_disagreeing_pods_attribute_nothing(uids: list[str]) -> None:
    text = "".join(f"{i}:x:/kubepods/pod{u}/{CID}\n" for i, u in enumerate(uids, start=1))
    identity = parse_cgroup_file(text)
    if len(set(uids)) > 1:
        assert identity is None
    else:
        assert identity == CgroupIdentity(uids[0], CID)


# --- /var/log/containers -------------------------------------------------------------


LOG_FORMS = [
    (
        f"trainer-0_ml-team_pytorch-{CID}.log",
        ContainerName("ml-team", "trainer-0", "pytorch", CID),
    ),
    # a pod name with dots (DNS subdomain), a container name with dashes and digits
    (
        f"web.v2-7d9f8b6c4-x2x9z_default_log-shipper-2-{CID}.log",
        ContainerName("default", "web.v2-7d9f8b6c4-x2x9z", "log-shipper-2", CID),
    ),
    # a container named like a hex string
    (f"p_ns_{'a' * 12}-{CID}.log", ContainerName("ns", "p", "a" * 12, CID)),
]

NOT_LOGS = [
    f"trainer-0_ml-team_pytorch-{CID}",  # no suffix
    f"trainer-0_ml-team_pytorch-{CID[:60]}.log",  # truncated by the kubelet
    f"trainer-0_ml-team-pytorch-{CID}.log",  # two parts
    f"Trainer_ml-team_pytorch-{CID}.log",  # not a DNS name
    f"trainer_ml_team_pytorch-{CID}.log",
    f"trainer-0_ml-team_-{CID}.log",
    f"_ml-team_pytorch-{CID}.log",
    f"trainer-0_ml-team_pytorch-{CID.upper()}.log",
    "0.log",
    ".",
    "",
    # 255 bytes is the limit; the kubelet cuts longer names (the ID is then incomplete)
    f"{'p' * 200}_ns_c-{CID}.log",
]


@pytest.mark.parametrize(("name", "expected"), LOG_FORMS)
def test_log_names(name: str, expected: ContainerName) -> None:
    assert parse_log_name(name) == expected


@pytest.mark.parametrize("name", NOT_LOGS)
def test_not_log_names(name: str) -> None:
    assert parse_log_name(name) is None


def test_an_id_named_twice_is_nobody() -> None:
    names = [f"a_ns_c-{CID}.log", f"b_ns_c-{CID}.log", f"c_ns_c-{OTHER}.log"]
    assert index_names(names) == {OTHER: ContainerName("ns", "c", "c", OTHER)}


_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@given(_LABEL, _LABEL, _LABEL, st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
def test_log_names_round_trip(pod: str, namespace: str, container: str, cid: str) -> None:
    """What the kubelet writes is read back exactly."""
    assert parse_log_name(f"{pod}_{namespace}_{container}-{cid}.log") == ContainerName(
        namespace, pod, container, cid
    )


@given(st.text(max_size=300))
def test_log_names_hostile(name: str) -> None:
    parsed = parse_log_name(name)
    if parsed is not None:
        assert (
            name == f"{parsed.pod}_{parsed.namespace}_{parsed.container}-{parsed.container_id}.log"
        )


_LAYOUTS = st.builds(
    lambda cgroup, driver, runtime, cgroupns: (cgroup, driver, runtime, cgroupns),
    st.sampled_from(["v1", "v2"]),
    st.sampled_from(["systemd", "cgroupfs"]),
    st.sampled_from(["containerd", "crio", "docker"]),
    st.booleans(),
)


@given(
    st.uuids(),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    _LAYOUTS,
    st.sampled_from(["burstable", "besteffort"]),
)
def test_every_layout_the_simulator_writes_reads_back(
    uid: object, cid: str, layout: tuple[str, str, str, bool], qos: str
) -> None:
    """What the simulated node writes (simulator/procfs.py, one claim per runtime
    and driver) is what the parser reads, in every combination."""
    from simulator.procfs import Layout, cgroup_file

    cgroup, driver, runtime, cgroupns = layout
    text = cgroup_file(Layout(cgroup, driver, runtime, cgroupns), str(uid), cid, qos)
    assert parse_cgroup_file(text) == CgroupIdentity(str(uid), cid)
