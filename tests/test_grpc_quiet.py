"""gRPC core's INFO lines ("Got goaway" when the kubelet stops under a call, as on a kubelet
restart) stay out of stderr unless GRPC_VERBOSITY asks for them.

The kubelet client's tests provoke it (calls still being answered when the simulated
kubelet stops); they run in their own process with stderr not captured, as `make test`
showed it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CASE = "tests/test_podresources.py"
ROOT = Path(__file__).resolve().parent.parent


def stderr_of_case(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", CASE],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**base, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_goaway_is_not_printed_unless_asked_for() -> None:
    assert "Got goaway" in stderr_of_case(GRPC_VERBOSITY="INFO")  # the case provokes it
    assert "Got goaway" not in stderr_of_case()
