"""The public surface: what `import eventbus` exports, what Bus offers, and the old spellings."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest

import eventbus
import eventbus.testing
import eventbus.types
from eventbus import Bus
from eventbus._deprecated import Moved
from eventbus.pull import Pull
from eventbus.scheduling import Schedules
from eventbus.types import DeliveryFilter
from eventbus.workflows import Machine, StepContext, Workflows

TOP_LEVEL = [
    "BackendError", "BackendUnavailable", "Bus", "CheckpointTooLarge", "ConfigurationError", "Context",
    "DeadLetter", "DecodeError", "DefinitionError", "EncodeError", "Envelope", "Event", "EventBusError",
    "Fail", "Goto", "GuardMismatch", "HandlerSignal", "HandlerTimeout", "Hooks", "InvalidKey",
    "InvalidSchedule", "Machine", "MigrationError", "NotFound", "PayloadTooLarge", "PublishError",
    "RegistrationError", "Retention", "RetentionOverride", "Retry", "RetryPolicy", "Router", "Schedule",
    "SchemaNotMigrated", "StepContext", "Uncertain", "UnknownApproval", "UnknownEventType",
    "UnknownInstance", "UnknownMachine", "UnknownSchedule", "Worker", "WorkflowError", "Yield",
]  # fmt: skip
"""The user's model: the bus, events, routers, workers, machines and outcomes, schedules, hooks,
retention, and the errors a caller catches or a handler raises."""

TYPES = [
    "ApprovalStatus", "AttemptRecord", "ChainDelivery", "ChainEvent", "DeliveryCondition",
    "DeliveryDetail", "DeliveryFilter", "DeliveryId", "DeliveryRow", "DeliveryStatus", "DstFold", "DstGap",
    "EffectStatus", "EventId", "EventTypeRow", "EventView", "HorizonHolder", "MissedPolicy", "OccurrenceInfo",
    "OccurrenceStatus",
    "OverlapPolicy", "PublishResult", "ScheduleInfo", "StartFrom", "StatusDetails", "StatusReport",
    "StatusRow", "SubscriptionInfo", "SubscriptionState", "SubscriptionStatus", "TableHealth",
    "TickReport", "WorkerRow", "WorkflowApprovalRow", "WorkflowChildRow", "WorkflowDefinitionRow",
    "WorkflowEffectRow", "WorkflowHistoryRow", "WorkflowInstance", "WorkflowSignalRow", "WorkflowStatus",
    "trace_id_of",
]  # fmt: skip
"""What the bus returns and takes: report rows, filters, ids, policies."""

DEPRECATED_IN_TYPES = {"DeadLetterFilter"}
"""Defined in eventbus.types for one more release, outside its ``__all__``."""

BUS_METHODS = [
    "aclose", "add", "add_hooks", "add_schedule", "cancel", "changes", "count_deliveries", "dead_id_batches",
    "dead_letters", "decode", "delivery", "event", "find_deliveries", "include", "list_subscriptions",
    "migrate", "outgoing", "pause_subscription", "prune", "publish", "publish_many", "publish_raw", "purge",
    "register", "release_stuck", "remove_subscription", "replay", "resume_subscription", "retry_now",
    "schedule", "specs", "status",
    "subscribe", "subscription_names", "trace", "validate_payload", "workers",
]  # fmt: skip
"""Bus's own public methods; state machines and schedules are the bundles bus.workflows, bus.schedules."""

WORKFLOW_SPELLINGS = {
    "start": "start", "instance": "instance", "instances": "instances", "history": "history",
    "signals": "signals", "approvals": "approvals", "workflow_counts": "counts", "signal": "signal",
    "approve": "approve", "deny": "deny", "repoint": "repoint", "cancel_instance": "cancel",
    "pause": "pause", "resume": "resume", "resolve": "resolve", "sweep_workflows": "sweep",
    "workflow_check": "check", "machine": "machine", "machines": "machines", "workflow_commits": "commits",
}  # fmt: skip
SCHEDULE_SPELLINGS = {
    "schedule_planner": "planner", "declare_schedules": "declare", "tick_schedules": "tick",
    "list_schedules": "list", "schedule_info": "info", "occurrences": "occurrences",
    "pause_schedule": "pause", "resume_schedule": "resume", "remove_schedule": "remove",
    "trigger_schedule": "trigger", "backfill_schedule": "backfill",
}  # fmt: skip


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


def _bus_methods() -> list[str]:
    return sorted(
        name
        for name in dir(Bus)
        if not name.startswith("_")
        and not isinstance(inspect.getattr_static(Bus, name), Moved)
        and callable(getattr(Bus, name))
    )


class _Store:
    """A workflow and schedule store answering the few reads the forwarding tests make."""

    async def counts(self, machine: str, cap: int | None = None) -> dict[tuple[str, str], int]:
        return {("A", "running"): 1}

    async def find(self, name: str | None = None) -> list[Any]:
        return []


class _Backend:
    kind = "sqlite"

    def __init__(self) -> None:
        self.workflows = self.schedules = _Store()


def _bus() -> Bus:
    bus = Bus(backend=_Backend())  # type: ignore[arg-type]
    m = Machine("orders", checkpoint=_Order, key=lambda c: c.id)

    @m.state(initial=True, on_success="DONE", on_failure="DONE")
    async def A(c: _Order, ctx: StepContext) -> None: ...

    m.terminal("DONE")
    bus.include(m)
    return bus


class _Order(msgspec.Struct):
    id: str


def test_all_lists_exactly_the_public_names() -> None:
    assert eventbus.__all__ == TOP_LEVEL
    assert eventbus.__all__ == _public(eventbus)
    assert len(eventbus.__all__) <= 45
    assert eventbus.types.__all__ == TYPES
    for module in (eventbus.types, eventbus.testing):
        assert module.__all__ == sorted(module.__all__), module.__name__
        assert _defined(module) - DEPRECATED_IN_TYPES <= set(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__


def test_bus_has_about_thirty_methods_and_two_bundles() -> None:
    assert _bus_methods() == BUS_METHODS
    assert len(BUS_METHODS) <= 38
    bus = _bus()
    assert isinstance(bus.workflows, Workflows)
    assert isinstance(bus.schedules, Schedules)
    assert isinstance(bus.pull, Pull)


def test_the_workflows_do_not_import_the_bus() -> None:
    """Not even for type checking: the engine gets its store and its commit queue."""
    for path in Path(eventbus.workflows.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("bus", "eventbus.bus"), f"{path.name} imports the bus"


@pytest.mark.parametrize(("old", "new"), sorted(WORKFLOW_SPELLINGS.items()))
def test_old_workflow_spellings_warn_and_forward(old: str, new: str) -> None:
    bus = _bus()
    with pytest.warns(DeprecationWarning, match=rf"Bus\.{old} is deprecated.*bus\.workflows\.{new}$"):
        found = getattr(bus, old)
    assert found == getattr(bus.workflows, new)


async def test_an_old_workflow_spelling_runs_the_new_one() -> None:
    bus = _bus()
    with pytest.warns(DeprecationWarning):
        assert await bus.workflow_counts("orders") == {("A", "running"): 1}
    with pytest.warns(DeprecationWarning):
        assert bus.machine("orders") is bus.workflows.machines["orders"]


@pytest.mark.parametrize(("old", "new"), sorted(SCHEDULE_SPELLINGS.items()))
def test_old_schedule_spellings_warn_and_forward(old: str, new: str) -> None:
    bus = _bus()
    with pytest.warns(DeprecationWarning, match=rf"Bus\.{old} is deprecated.*bus\.schedules\.{new}$"):
        found = getattr(bus, old)
    assert found == getattr(bus.schedules, new)


async def test_an_old_schedule_spelling_runs_the_new_one() -> None:
    bus = _bus()
    with pytest.warns(DeprecationWarning):
        assert await bus.list_schedules() == []


@pytest.mark.parametrize("name", sorted(set(eventbus._MOVED.homes) - DEPRECATED_IN_TYPES))
def test_names_moved_off_the_top_level_warn_once_and_resolve(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventbus._MOVED, "warned", set())
    home = eventbus._MOVED.homes[name]
    with pytest.warns(DeprecationWarning, match=rf"eventbus\.{name} is deprecated.*import it from {home}$"):
        found = getattr(eventbus, name)
    assert found is getattr(importlib.import_module(home), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(eventbus, name) is found  # once per name
    with pytest.raises(AttributeError):
        eventbus.NoSuchName  # noqa: B018


def test_the_old_dead_letter_filter_from_the_top_level_warns_once_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eventbus._MOVED, "warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from eventbus import DeadLetterFilter

        flt = DeadLetterFilter(subscription="charge")
    assert flt == DeliveryFilter(status="dead", subscription="charge")
    message = 'DeadLetterFilter is deprecated: use DeliveryFilter(status="dead", ...)'
    assert [(w.category, str(w.message), w.filename) for w in caught] == [
        (DeprecationWarning, message, __file__)
    ]


def test_every_name_of_the_previous_release_still_resolves() -> None:
    assert set(eventbus._MOVED.homes).isdisjoint(eventbus.__all__)
    assert len(set(eventbus._MOVED.homes) | set(eventbus.__all__)) >= 90


def test_import_eventbus_loads_no_database_driver() -> None:
    code = (
        "import sys, eventbus, eventbus.testing, eventbus.cli\n"
        "print(sorted(m for m in ('asyncpg', 'aiosqlite', 'sqlite3') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
