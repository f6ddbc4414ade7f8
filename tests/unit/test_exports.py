"""The public surface: what `import eventbus` exports, and what it does not load."""

from __future__ import annotations

import subprocess
import sys
import types

import eventbus
import eventbus.testing
import eventbus.types


def _public(module: types.ModuleType) -> list[str]:
    """Public names of the package: everything it binds but submodules and private names."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    )


def _defined(module: types.ModuleType) -> set[str]:
    """Public classes and functions a module defines itself."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    }


def test_all_lists_exactly_the_public_names() -> None:
    assert eventbus.__all__ == sorted(eventbus.__all__)
    assert eventbus.__all__ == _public(eventbus)
    for module in (eventbus.types, eventbus.testing):
        assert module.__all__ == sorted(module.__all__), module.__name__
        assert _defined(module) <= set(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__


def test_public_value_types_are_exported_from_the_package() -> None:
    assert set(eventbus.types.__all__) <= set(eventbus.__all__)


def test_import_eventbus_loads_no_database_driver() -> None:
    code = (
        "import sys, eventbus, eventbus.testing, eventbus.cli\n"
        "print(sorted(m for m in ('asyncpg', 'aiosqlite', 'sqlite3') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
