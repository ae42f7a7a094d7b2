"""Small helpers over grafana-foundation-sdk: one look for every panel of every dashboard.

Every panel and variable queries the `${datasource}` variable (never a fixed datasource
uid), so the JSON imports through the UI and through the Grafana sidecar alike. Queries are
given with OpenTelemetry names and translated by `monitoring.promql`.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, text, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Panel,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableModel,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.text import TextMode

from monitoring.groups import marked
from monitoring.promql import promql

PanelBuilder = Builder[Panel]
VariableBuilder = Builder[VariableModel]
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
ALL = ".*"
"""What "All" means in a multi-value variable: also matches series without the label
(devices nobody holds have no namespace), which `$__all`'s value list would miss."""


@dataclass(frozen=True, slots=True)
class Q:
    """One query of a panel: PromQL with OpenTelemetry names, and a legend."""

    expr: str
    legend: str = ""


Queries = Sequence[Q | str]


def _targets(queries: Queries, *, instant: bool) -> list[prom.Dataquery]:
    out = []
    for ref, query in zip(string.ascii_uppercase, queries, strict=False):
        q = Q(query) if isinstance(query, str) else query
        target = prom.Dataquery().expr(promql(q.expr)).ref_id(ref)
        if instant:
            target = target.instant().format(PromQueryFormat.TABLE)
        else:
            target = target.range()
        if q.legend:
            target = target.legend_format(q.legend)
        out.append(target)
    return out


def _exprs(queries: Queries) -> list[str]:
    return [q if isinstance(q, str) else q.expr for q in queries]


def _steps(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


def _last_value() -> common_builders.ReduceDataOptions:
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


GREEN = ((None, "green"),)
BAD_IF_ANY = ((None, "green"), (1, "red"))
"""For counts where anything above zero needs a look (errors, failed sources)."""


def timeseries_panel(
    title: str,
    description: str,
    queries: Queries,
    *,
    unit: str = "short",
    span: int = 12,
    height: int = 8,
    stacked: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
) -> timeseries.Panel:
    title, description = marked(title, description, _exprs(queries))
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(height)
        .fill_opacity(10 if not stacked else 40)
        .targets(_targets(queries, instant=False))  # type: ignore[arg-type]
    )
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    return panel


def stat_panel(
    title: str,
    description: str,
    query: Q | str,
    *,
    unit: str = "short",
    span: int = 4,
    height: int = 4,
    thresholds: tuple[tuple[float | None, str], ...] = GREEN,
) -> stat.Panel:
    title, description = marked(title, description, _exprs([query]))
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(height)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(_last_value())
        .thresholds(_steps(*thresholds))
        .targets(_targets([query], instant=True))  # type: ignore[arg-type]
    )


def bar_panel(
    title: str,
    description: str,
    queries: Queries,
    *,
    unit: str = "short",
    span: int = 8,
    height: int = 8,
    maximum: float | None = None,
) -> bargauge.Panel:
    title, description = marked(title, description, _exprs(queries))
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(height)
        .min(0)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(_last_value())
        .thresholds(_steps(*GREEN))
        .targets(_targets(queries, instant=True))  # type: ignore[arg-type]
    )
    return panel.max(maximum) if maximum is not None else panel


def table_panel(
    title: str,
    description: str,
    queries: Sequence[tuple[str, Q | str]],
    *,
    hide: Sequence[str] = (),
    unit: str = "short",
    span: int = 24,
    height: int = 8,
    units: dict[str, str] | None = None,
) -> table.Panel:
    """A table of instant queries merged on their labels; each value column gets its name."""
    title, description = marked(title, description, _exprs([q for _, q in queries]))
    names = [name for name, _ in queries]
    renames: dict[str, str] = {}
    if len(queries) == 1:
        renames["Value"] = names[0]
    else:
        refs = string.ascii_uppercase[: len(names)]
        renames |= {f"Value #{ref}": name for ref, name in zip(refs, names, strict=True)}
    transformations = [
        DataTransformerConfig(id_val="merge", options={}),
        DataTransformerConfig(
            id_val="organize",
            options={
                "excludeByName": {"Time": True, **{h: True for h in hide}},
                "renameByName": renames,
            },
        ),
    ]
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(height)
        .transformations(transformations)
        .targets(_targets([q for _, q in queries], instant=True))  # type: ignore[arg-type]
    )
    for column, column_unit in (units or {}).items():
        panel = panel.override_by_name(
            column, [DynamicConfigValue(id_val="unit", value=column_unit)]
        )
    return panel


def state_panel(
    title: str,
    description: str,
    queries: Queries,
    *,
    states: dict[str, tuple[str, str]],
    span: int = 12,
    height: int = 8,
) -> statetimeline.Panel:
    """A state timeline; `states` maps a value to (text, color)."""
    title, description = marked(title, description, _exprs(queries))
    mapping = ValueMap(
        options={v: ValueMappingResult(text=t, color=c) for v, (t, c) in states.items()}
    )
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(span)
        .height(height)
        .show_value(common.VisibilityMode.NEVER)
        .mappings([mapping])
        .thresholds(_steps(*GREEN))
        .targets(_targets(queries, instant=False))  # type: ignore[arg-type]
    )


def text_panel(title: str, content: str, *, span: int = 24, height: int = 4) -> text.Panel:
    return (
        text.Panel().title(title).mode(TextMode.MARKDOWN).content(content).span(span).height(height)
    )


# --- variables ---------------------------------------------------------------------


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(
    name: str, title: str, query: str, *, multi: bool = True, description: str = ""
) -> dash.QueryVariable:
    """A label_values() variable; multi-value ones default to All (`.*`)."""
    variable = (
        dash.QueryVariable(name)
        .label(title)
        .description(description or title)
        .datasource(DATASOURCE)
        .query(promql(query))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    if multi:
        variable = (
            variable.multi(True)
            .include_all(True)
            .all_value(ALL)
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
    return variable


def custom_variable(
    name: str, title: str, values: Sequence[str], description: str
) -> dash.CustomVariable:
    return (
        dash.CustomVariable(name)
        .label(title)
        .description(description)
        .values(",".join(values))
        .current(VariableOption(selected=True, text=values[0], value=values[0]))
        .options([VariableOption(selected=i == 0, text=v, value=v) for i, v in enumerate(values)])
    )
