"""gRPC core's INFO lines ("Got goaway" when the kubelet stops under a call, as on a kubelet
restart) stay out of stderr unless GRPC_VERBOSITY asks for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False,
        cwd=ROOT, env={**base, **env},
    )  # fmt: skip


def test_grpc_verbosity_defaults_to_errors_only_and_can_be_raised() -> None:
    probe = "import exporter.podresources.client, os; print(os.environ['GRPC_VERBOSITY'])"
    assert run("-c", probe).stdout.strip() == "ERROR"
    assert run("-c", probe, GRPC_VERBOSITY="DEBUG").stdout.strip() == "DEBUG"


def test_the_kubelet_client_tests_print_no_goaway() -> None:
    """They stop the simulated kubelet under calls; with stderr visible (as `make test`
    showed it) gRPC's "Got goaway" must not appear."""
    done = run("-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_podresources.py")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "Got goaway" not in done.stdout + done.stderr
