"""A Griffe extension: the docstrings' reST markup as Markdown for the API reference.

The library's docstrings are written in reST (``:param x:``, ``:class:`Hooks```, ``:meth:`publish```).
mkdocstrings parses the fields; this rewrites each role into a Markdown cross-reference
(``[`Hooks`][eventbus.observe.Hooks]``) resolved in the scope of the object whose docstring it
is, as Python would resolve the name there. A name that does not resolve inside the project, or
resolves to something the reference does not render, stays a cross-reference anyway, so
``mkdocs build --strict`` fails on it: a broken reference in a docstring is a build error.
Standard-library names (``:class:`TimeoutError```, ``:mod:`logging```) become plain code.
A paragraph ending in ``::`` before an indented literal block ends in ``:``; the indented block
is already a Markdown code block.
"""

from __future__ import annotations

import builtins
import re
import sys
from typing import Any

from griffe import Alias, Extension, Module, NameResolutionError, Object

ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|exc|mod|data|obj|const):`(~?)([^`<>]+)`")
CALLABLE_ROLES = {"meth", "func"}
LITERAL_MARK = re.compile(r"(\S)?[ \t]*::\n(?=[ \t]*\n)")


def _is_stdlib(target: str) -> bool:
    head = target.split(".", 1)[0]
    return head in sys.stdlib_module_names or hasattr(builtins, head)


def _relative(obj: Object, target: str) -> str:
    """``.name`` / ``..name``: from the package of the object's module, as a relative import."""
    module = obj if isinstance(obj, Module) else obj.module
    package: Object | None = module if module.is_package else module.parent
    name = target.lstrip(".")
    for _ in range(len(target) - len(name) - 1):
        package = package.parent if package else None
    return f"{package.path}.{name}" if package else name


def _resolve(obj: Object, target: str) -> str | None:
    """The full path ``target`` names in ``obj``'s scope, or ``None`` when it is not the project's."""
    if target.startswith("."):
        return _relative(obj, target)
    head, _, rest = target.partition(".")
    if head == obj.package.name:
        return target
    try:
        path = obj.resolve(head)  # members, imports, then the enclosing scopes
    except NameResolutionError:
        return None
    return f"{path}.{rest}" if rest else path


def _link(obj: Object, match: re.Match[str]) -> str:
    role, short, target = match.groups()
    shown = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
    if role in CALLABLE_ROLES:
        shown += "()"
    path = _resolve(obj, target)
    if path is None or path.split(".", 1)[0] != obj.package.name:
        if _is_stdlib(target):
            return f"`{shown}`"
        path = target  # left for autorefs to report as broken
    return f"[`{shown}`][{path}]"


def _markdown(obj: Object, text: str) -> str:
    text = LITERAL_MARK.sub(lambda m: f"{m.group(1)}:\n" if m.group(1) else "\n", text)
    return ROLE.sub(lambda m: _link(obj, m), text)


def _rewrite(obj: Object) -> None:
    if obj.docstring is not None and ":" in obj.docstring.value:
        obj.docstring.value = _markdown(obj, obj.docstring.value)
    for member in obj.members.values():
        if not isinstance(member, Alias):
            _rewrite(member)


class ReSTMarkup(Extension):
    """Rewrites the reST markup of every docstring of a loaded package."""

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        _rewrite(pkg)
