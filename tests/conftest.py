"""Suite-wide options and fixtures. Golden files: `pytest --update-golden` rewrites them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.realcluster import binaries
from tests.realcluster.controlplane import ControlPlane, running


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
