"""A Griffe extension: the ``__init__`` of each ``msgspec.Struct``, as Griffe makes one for dataclasses.

A Struct's fields are its annotated class attributes, those of its Struct bases first; with
``kw_only=True`` on a class, that class's fields are keyword-only. The reference then shows each
Struct's signature, and ``:param …:`` fields in a Struct's docstring match real parameters.
"""

from __future__ import annotations

from typing import Any

from griffe import Attribute, Class, Expr, Extension, Function, Module, Parameter, ParameterKind, Parameters

STRUCT = "msgspec.Struct"


def _direct(cls: Class) -> bool:
    return any(isinstance(base, Expr) and base.canonical_path == STRUCT for base in cls.bases)


def _is_struct(cls: Class) -> bool:
    try:
        parents = cls.mro()
    except ValueError:
        parents = []
    return _direct(cls) or any(_direct(p) for p in parents)


def _fields(cls: Class) -> list[Parameter]:
    kw_only = str(cls.keywords.get("kw_only", "False")) == "True"
    kind = ParameterKind.keyword_only if kw_only else ParameterKind.positional_or_keyword
    fields = []
    for member in cls.members.values():
        if member.is_alias or not isinstance(member, Attribute) or member.annotation is None:
            continue
        if "class-attribute" in member.labels and "instance-attribute" not in member.labels:
            continue  # a ClassVar
        fields.append(Parameter(member.name, annotation=member.annotation, kind=kind, default=member.value))
    return fields


def _set_init(cls: Class) -> None:
    try:
        chain = [*reversed(cls.mro()), cls]
    except ValueError:
        chain = [cls]
    by_name: dict[str, Parameter] = {}
    for part in chain:
        if _is_struct(part):
            by_name.update((p.name, p) for p in _fields(part))
    ordered = sorted(by_name.values(), key=lambda p: p.kind is ParameterKind.keyword_only)
    self_param = Parameter("self", kind=ParameterKind.positional_or_keyword)
    init = Function("__init__", lineno=0, endlineno=0, parent=cls, returns="None")
    init.parameters = Parameters(self_param, *ordered)
    cls.set_member("__init__", init)


def _walk(obj: Module | Class) -> None:
    for member in list(obj.members.values()):
        if member.is_alias:
            continue
        if isinstance(member, Class):
            if "__init__" not in member.members and _is_struct(member):
                _set_init(member)
            _walk(member)
        elif isinstance(member, Module):
            _walk(member)


class MsgspecStructs(Extension):
    """Gives every ``msgspec.Struct`` of a loaded package its ``__init__``."""

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        _walk(pkg)
