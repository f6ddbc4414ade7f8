"""Spellings kept for one release: each warns with a :class:`DeprecationWarning`, then forwards."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["Moved", "MovedNames"]


class Moved:
    """A method or attribute that moved into one of the class's bundles.

    ``start = Moved("workflows")`` makes ``bus.start`` warn and give
    ``bus.workflows.start``; ``Moved("schedules", "pause")`` renames too.
    """

    def __init__(self, bundle: str, name: str | None = None) -> None:
        self.bundle = bundle
        self.name = name
        self.attr = ""
        self.owner = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr
        self.owner = owner.__name__
        self.name = self.name or attr

    @property
    def new_spelling(self) -> str:
        """Where the attribute lives now, as the caller writes it."""
        return f"{self.owner.lower()}.{self.bundle}.{self.name}"

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(
            f"{self.owner}.{self.attr} is deprecated and will be removed in the next release: "
            f"use {self.new_spelling}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(getattr(obj, self.bundle), self.name or self.attr)


class MovedNames:
    """The names that left a package's top level, each for the module in ``homes``.

    A package's ``__getattr__`` calls :meth:`resolve`: each name warns the
    first time it is looked up, then resolves to its new home. Names in
    ``warns_itself`` are deprecated where they live too and warn each time
    they are called: looking them up stays silent, so a use warns once.
    """

    def __init__(self, package: str, homes: Mapping[str, str], warns_itself: Collection[str] = ()) -> None:
        self.package = package
        self.homes = dict(homes)
        self.warns_itself = frozenset(warns_itself)
        self.warned: set[str] = set()

    def resolve(self, name: str) -> Any:
        """The moved name's value; AttributeError for a name that never was there."""
        home = self.homes.get(name)
        if home is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        if name not in self.warned and name not in self.warns_itself:
            self.warned.add(name)
            warnings.warn(
                f"{self.package}.{name} is deprecated and will be removed in the next release: "
                f"import it from {home}",
                DeprecationWarning,
                stacklevel=3,
            )
        return getattr(importlib.import_module(home), name)
