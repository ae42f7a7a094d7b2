"""dcgm-exporter's XID alert, unchanged, fires on our `DCGM_FI_DEV_XID_ERRORS` (promtool).

dcgm-exporter serves `DCGM_FI_DEV_XID_ERRORS` as a gauge, "Value of the last XID error
encountered." (etc/default-counters.csv), 0 on a GPU that had none; the alert rule users run
on it is `DCGM_FI_DEV_XID_ERRORS > 0` (the form found across public PrometheusRules; NVIDIA
ships none). The input series are the exporter's own dcgm-schema output on the demo node at
scenario time 31 s, after XID 13 on GPU 2 at 3 s: promtool must fire the alert for GPU 2
alone, with the XID as its value.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.nvml_support import fakenvml
from tests.peers import promtool
from tests.support import metrics_text
from tests.support.simulated_node import scenario_snapshot

__all__ = ["fakenvml"]

RULE = {
    "groups": [
        {
            "name": "dcgm-exporter-xid",
            "rules": [
                {
                    "alert": "GPUXidError",
                    "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
                    "for": "1m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "GPU {{ $labels.gpu }} XID {{ $value }}"},
                }
            ],
        }
    ]
}
SERIES = re.compile(r"^(DCGM_FI_DEV_XID_ERRORS)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def xid_series(text: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = SERIES.match(line)
        if m:
            out.append((dict(LABEL.findall(m[2])), float(m[3])))
    return out


def selector(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"DCGM_FI_DEV_XID_ERRORS{{{inner}}}"


@pytest.mark.peer
async def test_dcgm_exporter_xid_alert_fires_for_the_gpu_with_the_xid(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = await scenario_snapshot("demo", tmp_path, monkeypatch)
    series = xid_series(metrics_text(snapshot, schema=("dcgm",)))
    # every GPU and MIG slice has the series; only GPU 2 had an XID (13, at 3 s)
    assert {labels["gpu"] for labels, _ in series} == {"0", "1", "2", "3"}
    assert len(series) == 4 + 4  # four GPUs, four slices of GPU 1
    assert {labels["gpu"]: value for labels, value in series if "GPU_I_ID" not in labels} == {
        "0": 0.0,
        "1": 0.0,
        "2": 13.0,
        "3": 0.0,
    }
    (held,) = [labels for labels, value in series if value]
    tests: dict[str, Any] = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {"series": selector(labels), "values": f"{value:g}x10"}
                    for labels, value in series
                ],
                "alert_rule_test": [
                    {"eval_time": "30s", "alertname": "GPUXidError", "exp_alerts": []},
                    {
                        "eval_time": "2m",
                        "alertname": "GPUXidError",
                        "exp_alerts": [
                            {
                                "exp_labels": held | {"severity": "critical"},
                                "exp_annotations": {"summary": "GPU 2 XID 13"},
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(RULE))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    # and the test can fail: a GPU without an XID does not fire
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["gpu"] = "0"
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    assert promtool("test", "rules", str(tmp_path / "tests.yaml")).returncode != 0
