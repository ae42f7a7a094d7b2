"""A small kustomize renderer for the subset deploy/ uses, so manifests are validated as
applied even where no kustomize binary exists (CI has none; `kubectl kustomize` is compared
with it when present).

Supported: `resources` (files, and directories with a kustomization.yaml), `namespace`,
and `patches` given by `path` (strategic merge: maps merge, lists of named items merge by
`name`, other lists are replaced). Anything else raises, so a kustomization using a feature
this renderer lacks fails loudly instead of rendering wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "resources", "patches", "namespace"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "SecurityContextConstraints",
    "CustomResourceDefinition",
}


class KustomizeError(ValueError):
    pass


def kustomization(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    unknown = set(doc) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{path}: fields this renderer does not implement: {unknown}")
    return doc


def references(directory: Path) -> list[Path]:
    """Every file or directory a kustomization names (resources and patch paths)."""
    doc = kustomization(directory)
    refs = [directory / r for r in doc.get("resources", [])]
    for patch in doc.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{directory}: only `path` patches are supported: {patch}")
        refs.append(directory / patch["path"])
    return refs


def build(directory: Path) -> list[dict[str, Any]]:
    doc = kustomization(directory)
    resources: list[dict[str, Any]] = []
    references(directory)  # checks the patch entries
    for ref in (directory / r for r in doc.get("resources", [])):
        if ref.is_dir():
            resources += build(ref)
        elif ref.is_file():
            resources += [d for d in yaml.safe_load_all(ref.read_text()) if d]
        else:
            raise KustomizeError(f"{directory}: resource {ref} does not exist")
    _no_duplicates(resources, directory)
    for patch in doc.get("patches", []):
        for change in yaml.safe_load_all((directory / patch["path"]).read_text()):
            target = _find(resources, change, directory)
            merged = merge(target, change)
            target.clear()
            target.update(merged)
    if "namespace" in doc:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = doc["namespace"]
    return resources


def key(resource: dict[str, Any]) -> tuple[str, str, str]:
    meta = resource["metadata"]
    return resource["kind"], meta.get("namespace", ""), meta["name"]


def _no_duplicates(resources: list[dict[str, Any]], directory: Path) -> None:
    keys = [key(r) for r in resources]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise KustomizeError(f"{directory}: resources defined twice: {duplicates}")


def _find(
    resources: list[dict[str, Any]], patch: dict[str, Any], directory: Path
) -> dict[str, Any]:
    for resource in resources:
        if key(resource) == key(patch) and resource["apiVersion"] == patch["apiVersion"]:
            return resource
    raise KustomizeError(f"{directory}: patch target {key(patch)} not found")


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge for maps and lists of named items."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        # As kustomize: named items merge in place, new ones come first, in patch order.
        by_name = {item["name"]: item for item in patch}
        merged = [merge(item, by_name[item["name"]]) if item["name"] in by_name else item
                  for item in base]  # fmt: skip
        known = {item["name"] for item in base}
        return [item for item in patch if item["name"] not in known] + merged
    return patch


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)
