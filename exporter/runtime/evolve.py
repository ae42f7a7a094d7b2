"""`evolve`: `dataclasses.replace` for the frozen, slotted records a cycle hands on.

Each step after collect hands on a changed snapshot (two dozen fields) or join result;
`dataclasses.replace` builds the copy through `__init__`, by name, every field set through
`object.__setattr__`. `evolve` copies the slots at once and sets only the changed ones:
the same object for the classes it takes, and it refuses the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from operator import attrgetter
from typing import Any, TypeVar

_D = TypeVar("_D")
_Copier = tuple[frozenset[str], Callable[[Any], tuple[Any, ...]], tuple[Any, ...]]
_COPIERS: dict[type, _Copier] = {}
_new_object = object.__new__
_set_attribute = object.__setattr__


def evolve(obj: _D, /, **changes: Any) -> _D:
    """`dataclasses.replace(obj, **changes)` for a slotted dataclass with no
    `__post_init__` (the snapshot, the join's result); TypeError for a field it lacks, as
    `replace` raises, and for a class it does not take."""
    cls = type(obj)
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _copier(cls)
    names, values, setters = copier
    if not names.issuperset(changes):
        unknown = sorted(set(changes) - names)
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
    out = _new_object(cls)
    for put, value in zip(setters, values(obj), strict=True):
        put(out, value)
    for name, value in changes.items():
        _set_attribute(out, name, value)
    return out


def _copier(cls: type) -> _Copier:
    """(its field names, all their values of an object at once, each slot's setter)."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: evolve takes a dataclass")
    every = tuple(f.name for f in fields(cls))
    if hasattr(cls, "__post_init__") or set(getattr(cls, "__slots__", ())) != set(every):
        raise TypeError(f"{cls.__name__}: evolve takes a slotted dataclass, no __post_init__")
    if not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: evolve takes a dataclass whose fields are all init")
    get = attrgetter(*every)
    values = get if len(every) > 1 else (lambda obj: (get(obj),))
    return frozenset(every), values, tuple(getattr(cls, n).__set__ for n in every)
