"""Helpers shared by the command-line modules."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import anyio
import click
import msgspec

from ..bus import MAX_DELAY_SECONDS, Bus
from ..errors import ConfigurationError, EventBusError

__all__ = ["COUNT", "ID", "SECONDS", "Obj", "enc_hook", "load_app", "run", "user_errors"]

T = TypeVar("T")

MAX_INT64 = 2**63 - 1
"""The largest id or count a database column holds (a signed 64-bit integer)."""


class Positive(click.types.IntParamType):
    """A whole number from 1 to what a 64-bit column holds: what no row can have is refused first."""

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not 1 <= number <= MAX_INT64:
            self.fail(f"{number} is not {self.what} (a whole number from 1 to 2**63-1)", param, ctx)
        return number


ID = Positive("an id")
"""A delivery, event or approval id."""

COUNT = Positive("a count")
"""A limit or batch size."""


class Seconds(click.types.FloatParamType):
    """A finite number of seconds, zero or more and at most 100 years (as a publish delay)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_DELAY_SECONDS):
            self.fail(f"{value!r} is not a finite number of seconds from 0 to 100 years", param, ctx)
        return seconds


SECONDS = Seconds()


def _loop_options() -> dict[str, Any]:
    """uvloop when installed (``pip install eventbus[fast]``): about 10% less CPU per event."""
    return {"use_uvloop": True} if importlib.util.find_spec("uvloop") else {}


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A user's mistake (a typed eventbus error, a click error), even one raised inside a task
    group, becomes click's one line and non-zero exit."""
    try:
        yield
    except EventBusError as exc:
        raise _one_line(exc) from exc
    except BaseExceptionGroup as group:
        mistake = _user_mistake(group)
        if mistake is None:
            raise
        raise _one_line(mistake) from mistake


def _one_line(exc: BaseException) -> click.ClickException:
    if isinstance(exc, click.ClickException):
        return exc
    assert isinstance(exc, EventBusError)
    return click.ClickException(f"{type(exc).__name__}: {exc.message}")


def _user_mistake(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first of ``group``'s exceptions when every one is a user's mistake, else None."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = exc.exceptions
        else:
            leaves.append(exc)
    if leaves and all(isinstance(e, click.ClickException | EventBusError) for e in leaves):
        return leaves[0]
    return None


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn``; a user's mistake is one line (see :func:`user_errors`)."""
    with user_errors():
        return anyio.run(fn, backend_options=_loop_options())


def load_app(spec: str) -> Bus:
    """Import ``module:attribute`` and return its Bus; a mistake is one line, in or out of ``run``."""
    with user_errors():
        return _import_bus(spec)


def _import_bus(spec: str) -> Bus:
    module_name, _, attr = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigurationError(f"{spec!r} is not module:attribute (a dotted module name, then the Bus)")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    bus = getattr(module, attr or "bus", None)
    if not isinstance(bus, Bus):
        raise ConfigurationError(f"{spec!r} is not an eventbus.Bus (use module:attribute)")
    return bus


class Obj(msgspec.Struct):
    """The database options of the command line (``--dsn``, ``--schema`` or their variables)."""

    dsn: str | None
    schema: str | None
    schema_on_command_line: bool = False
    verbose: int = 0

    def bus(self) -> Bus:
        """A bus on the options' database; a malformed DSN or schema is one line, in or out of ``run``."""
        with user_errors():
            return self._checked(Bus(self.dsn, schema=self.schema))

    def publisher_for(self, app: Bus) -> Bus:
        """Where ``publish --app`` writes: the options when given, else the app's own database."""
        if not self.dsn and not self.schema:
            return app
        return self._checked(Bus(self.dsn or app.dsn, schema=self.schema or _schema_of(app)))

    def check_worker_target(self, app: Bus, spec: str) -> None:
        """A worker serves the app's bus as built: options that name another database are refused."""
        with user_errors():
            self._check_target(app, spec)

    def _check_target(self, app: Bus, spec: str) -> None:
        if self.dsn and self.dsn != app.dsn:
            raise ConfigurationError(
                f"--dsn (or EVENTBUS_DSN) names another database than {spec} was built with"
            )
        schema = _schema_of(app)
        if self.schema and schema is not None and self.schema != schema:
            raise ConfigurationError(
                f"--schema {self.schema} differs from the schema {spec} was built with ({schema}); "
                "set EVENTBUS_SCHEMA for both or pass schema= to its Bus"
            )
        self._checked(app)

    def _checked(self, bus: Bus) -> Bus:
        if self.schema_on_command_line and _schema_of(bus) is None:
            raise ConfigurationError(
                f"--schema applies to PostgreSQL only; {bus.backend.kind} has no schemas"
            )
        return bus


def _schema_of(bus: Bus) -> str | None:
    schema = getattr(bus.backend, "schema_name", None)
    return schema if isinstance(schema, str) else None


def enc_hook(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
