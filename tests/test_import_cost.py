"""Nothing expensive at import time (issue 27 item 7): starting the exporter imports its
modules; a bcrypt hash (50-60 ms at cost 12) or the OpenTelemetry SDK belongs to the
configurations that use them, made when first needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.peer

PROBE = """
import sys, bcrypt
hashed = []
real = bcrypt.hashpw
bcrypt.hashpw = lambda *a: hashed.append(a) or real(*a)
import exporter.app, exporter.cli.main, exporter.web.auth, exporter.web.basicauth
import exporter.web.config
print(len(hashed), sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry", "kubernetes"}))
"""


def test_importing_the_exporter_hashes_nothing_and_loads_no_otlp_sdk() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout.split(maxsplit=1)
    assert out == ["0", "[]\n"]
