"""Which labels every series should carry, decided with bytes: one dense scrape re-written
with each placement of the identity labels."""

from __future__ import annotations

import gzip
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

KEYS = ("hw_type", "hw_vendor", "hw_model", "hw_parent")
"""Kept on every series: the dashboards' filters and groupings and the alerts' texts."""


@dataclass(frozen=True)
class Placement:
    name: str
    text_bytes: int
    gzip_bytes: int


def _line(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {value}\n" if inner else f"{name} {value}\n"


def placements(text: str) -> list[Placement]:
    samples = [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.startswith("process_")
    ]
    info = {labels["hw_id"]: labels for name, labels, _ in samples if name == "hw_info"}

    def rewrite(extra: bool, keys: bool) -> str:
        out = []
        for name, labels, value in samples:
            device = info.get(labels.get("hw_id", ""))
            if name != "hw_info" and device is not None and not name.startswith("hw_allocation"):
                labels = dict(labels)
                if extra:
                    labels |= {k: v for k, v in device.items() if not k.startswith("k8s_")}
                if not keys:
                    for key in KEYS:
                        labels.pop(key, None)
            out.append(_line(name, labels, value))
        return "".join(out)

    variants = {
        "every identity label on every series (before)": rewrite(True, True),
        "hw_id, type, vendor, model, parent on every series; the rest on hw_info (now)": (
            rewrite(False, True)
        ),
        "hw_id only on every series; everything else on hw_info": rewrite(False, False),
    }
    return [
        Placement(name, len(body.encode()), len(gzip.compress(body.encode(), 1)))
        for name, body in variants.items()
    ]
