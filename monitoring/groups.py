"""Which opt-in metric groups a panel's queries read (`exporter.metrics.GROUPS`), so that a
panel that shows nothing on the default set says so on its face.

A query needs a group when it reads a metric of that group, or selects a label value that
puts series in it (`hw.errors{error.type="nvlink_crc"}` is `interconnect`). A query that
reads a metric some of whose series are in another group, without selecting on that label,
works on the default set and shows more with the group on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from exporter.metrics import SPECS
from exporter.settings.table import CORE

_NAME = re.compile(r"(?<![\w.])((?:hw|k8s|kube_device_exporter)\.[a-z0-9_.]*[a-z0-9_])")


def groups_read(exprs: Iterable[str]) -> tuple[set[str], set[str]]:
    """(groups the queries need, groups that add series to what they show)."""
    needed: set[str] = set()
    more: set[str] = set()
    for expr in exprs:
        for name in set(_NAME.findall(expr)) & set(SPECS):
            spec = SPECS[name]
            if spec.group != CORE:
                needed.add(spec.group)
            for key, value, group in spec.value_groups:
                selected = re.search(rf'{re.escape(key)}\s*(=~?|!~?)\s*"([^"]*)"', expr)
                if selected is None:
                    more.add(group)
                    continue
                op, pattern = selected.groups()
                exact = op == "=" and pattern == value
                if exact or (op == "=~" and re.fullmatch(pattern, value)):
                    needed.add(group)
    return needed, more - needed


def marked(title: str, description: str, exprs: Iterable[str]) -> tuple[str, str]:
    """The panel's title and description with the groups it needs (every query does) or
    can use (some query needs it, or reads more series with it) said."""
    each = [groups_read([expr]) for expr in exprs]
    needed = set.intersection(*(n for n, _ in each)) if each else set()
    more = set().union(*(n | m for n, m in each)) - needed
    if needed:
        flags = ", ".join(f"`--metrics.group.{g}`" for g in sorted(needed))
        title = f"{title} (opt-in: {', '.join(sorted(needed))})"
        description = (
            f"Needs {flags} (off by default; docs/metrics.md, Metric groups). {description}"
        )
    if more:
        flags = ", ".join(f"`--metrics.group.{g}`" for g in sorted(more))
        description = f"{description} More series with {flags}."
    return title, description
