"""Suite-wide options and fixtures. Golden files: `pytest --update-golden` rewrites them.
The `peer` and `slow` markers and what holds them to their word: tests/support/tiers.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.realcluster import binaries
from tests.realcluster.controlplane import ControlPlane, running
from tests.realnode.binaries import Missing, node_tools

if TYPE_CHECKING:
    # Imported where used: it imports grpc, which must come after exporter/__init__.py has
    # set GRPC_VERBOSITY (tests/test_grpc_quiet.py).
    from tests.realcluster.node import ClusterNode

pytest_plugins = ["tests.support.tiers"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/* from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(pytestconfig: pytest.Config) -> bool:
    return bool(pytestconfig.getoption("--update-golden"))


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The real-cluster tier's Kubernetes 1.36 control plane, shared by the session; skipped
    with one line when the binaries are not named (tests/realcluster, docs/testing.md)."""
    why = binaries.missing()
    if why is not None:
        pytest.skip(f"real cluster: {why}")
    with running() as plane:
        yield plane


@pytest.fixture(scope="session")
def cluster_node(control_plane: ControlPlane) -> Iterator[ClusterNode]:
    """A real 1.36 kubelet (containerd, images, a device plugin) joined to the control
    plane, Ready; skipped with one line without root or the Debian tools."""
    try:
        node_tools()
    except Missing as exc:
        pytest.skip(f"real cluster node: {exc}")
    from tests.realcluster.node import ClusterNode

    node = ClusterNode(control_plane)
    try:
        yield node.start()
    finally:
        left = node.close()
        assert not left, f"the cluster node left behind: {left}"


SERIAL_MODULES = ("test_real_", "test_image.py", "test_podsapi_proto.py")
"""Modules whose tests start a kubelet, a Kubernetes control plane or a Docker engine."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`make test`: two workers), the tiers that start a kubelet, a
    cluster or a Docker engine are one unit of work, run in one worker in their order (they
    share the session's control plane and the machine's containerd, mounts and iptables),
    handed out first as the largest; every other test is a unit of its own. (xdist's
    `loadgroup` does not group on pytest 9: it renames the item's `_nodeid`, which pytest 9
    no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SerialPeers(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            module = Path(nodeid.split("::", 1)[0]).name
            return "serial-peers" if module.startswith(SERIAL_MODULES) else nodeid

    return SerialPeers(config, log)
