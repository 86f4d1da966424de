"""Tuning knobs: shape and layout choices that change what a graph lowers to, as one immutable value.

A knob is declared once, in the module whose kernels it tunes, with its default and what it does;
related knobs as a table whose entries are named "<table>.<key>":

    GEMV = knob_table("gemv", unroll=(None, "steps a lane loads before adding them (None: by device)"), ...)
    ... GEMV["unroll"]          # "gemv.unroll" in the tuning in effect (read-only)

A `Tuning` is a frozen mapping of knob names to values (the defaults, with overrides); it is
hashable and part of every program cache key that depends on it: a `Graph` keeps the tuning in
effect where it was made, lowers under it and hashes it into its signature, and the HC ops and the
model key their cached programs by it. So a changed knob gives a new program; a program compiled
under other values is never reused. Set knobs for a block with `tuned(...)` (or pass a `Tuning` to
`Model.load(..., tuning=)`); an unknown name is refused, naming the known ones. A knob is known once
its module has been imported (the ops and hc ones with `dsv4_vk`, the model ones with
`dsv4_vk.model`).
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping


@dataclass(frozen=True)
class Knob:
    """One tuning knob: its dotted name, default and what it changes."""
    name: str
    default: Any
    doc: str

    def get(self) -> Any:
        """The knob's value in the tuning in effect (`current()`)."""
        return current()[self.name]


_KNOBS: dict[str, Knob] = {}


def knob(name: str, default: Any, doc: str) -> Knob:
    """Declare the knob `name` (dotted, e.g. "gemv.unroll") with its default; once per name."""
    if name in _KNOBS:
        raise ValueError(f"tuning knob {name!r} is declared twice")
    _KNOBS[name] = k = Knob(name, default, doc)
    return k


class KnobTable(Mapping[str, Any]):
    """Knobs named "<prefix>.<key>", read by key from the tuning in effect (read-only: set them with
    `tuned` or the table's own `tuned(key=value, ...)`)."""

    def __init__(self, prefix: str, entries: Mapping[str, tuple[Any, str]]) -> None:
        self.prefix = prefix
        self._keys = tuple(entries)
        for key, (default, doc) in entries.items():
            knob(self.name(key), default, doc)

    def name(self, key: str) -> str:
        """The knob's dotted name."""
        return f"{self.prefix}.{key}"

    def __getitem__(self, key: str) -> Any:
        return current()[self.name(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def tuned(self, **values: Any) -> contextlib.AbstractContextManager[Tuning]:
        """`tuned` with these keys of the table set."""
        return tuned({self.name(k): v for k, v in values.items()})

    def __repr__(self) -> str:
        return f"KnobTable({self.prefix!r}, {dict(self)!r})"


def knob_table(prefix: str, **entries: tuple[Any, str]) -> KnobTable:
    """Declare knobs "<prefix>.<key>" for each key=(default, doc); the table reads them by key."""
    return KnobTable(prefix, entries)


def knobs() -> dict[str, Knob]:
    """The knobs declared so far, by name."""
    return dict(_KNOBS)


def _check_name(name: str) -> None:
    if name not in _KNOBS:
        close = difflib.get_close_matches(name, _KNOBS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown tuning knob {name!r}{hint}; known knobs: {', '.join(sorted(_KNOBS))}")


class Tuning(Mapping[str, Any]):
    """An immutable set of knob values: every declared knob at its default unless overridden.
    Equal tunings (the same overrides that differ from the defaults) hash alike."""
    __slots__ = ("_over", "_key")

    def __init__(self, overrides: Mapping[str, Any] | None = None, **kw: Any) -> None:
        over = dict(overrides or {}, **kw)
        for name in over:
            _check_name(name)
        self._over = {k: v for k, v in over.items() if v != _KNOBS[k].default or type(v) is not type(_KNOBS[k].default)}
        self._key = tuple(sorted((k, repr(v)) for k, v in self._over.items()))

    def __getitem__(self, name: str) -> Any:
        if name in self._over:
            return self._over[name]
        _check_name(name)
        return _KNOBS[name].default

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(_KNOBS))

    def __len__(self) -> int:
        return len(_KNOBS)

    def overrides(self) -> dict[str, Any]:
        """The knobs set to something other than their defaults."""
        return dict(self._over)

    def replace(self, overrides: Mapping[str, Any] | None = None, **kw: Any) -> Tuning:
        """A tuning with these knobs changed as well."""
        return Tuning({**self._over, **dict(overrides or {}), **kw})

    def key(self) -> tuple:
        """What cache keys hold of this tuning: its overrides, sorted."""
        return self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tuning) and other._key == self._key

    def __repr__(self) -> str:
        return f"Tuning({self._over!r})"


DEFAULT = Tuning()
_current: contextvars.ContextVar[Tuning] = contextvars.ContextVar("dsv4_vk_tuning", default=DEFAULT)


def current() -> Tuning:
    """The tuning in effect in this thread (the defaults unless inside `tuned`)."""
    return _current.get()


@contextlib.contextmanager
def tuned(overrides: Mapping[str, Any] | Tuning | None = None, **kw: Any) -> Iterator[Tuning]:
    """Run a block with these knobs set on top of the tuning in effect (a `Tuning` replaces it):
    `with tuned({"gemv.unroll": 2}): ...`. Yields the tuning in effect inside."""
    t = overrides.replace(**kw) if isinstance(overrides, Tuning) else current().replace(overrides, **kw)
    token = _current.set(t)
    try:
        yield t
    finally:
        _current.reset(token)
