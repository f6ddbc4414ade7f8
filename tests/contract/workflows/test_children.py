"""Child machines on every backend: fan out, fan in (all, any, a count), outcomes, cancel cascades."""

from __future__ import annotations

from typing import Any, Literal

import anyio
import msgspec
import pytest

from eventbus import Bus
from eventbus.backends.base import ALL_CHILDREN, WorkflowHistoryEntry, WorkflowStart, WorkflowTransition
from eventbus.errors import DefinitionError, InvalidOutcome
from eventbus.workflows import Machine, StepContext, Yield, diagram

from ...features.workflows._support import finish, run_until, status_is


class Kid(msgspec.Struct):
    key: str
    n: int
    fail: bool = False
    hold: bool = False
    square: int | None = None


kid = Machine("kid", checkpoint=Kid, key=lambda c: c.key)


@kid.state(initial=True, on_success="DONE", on_failure="FAILED", continue_run=False, wake_on="go",
           poll=60.0, max_visits=3)  # fmt: skip
async def WORK(c: Kid, ctx: StepContext) -> Yield | None:
    if c.hold and ctx.signal("go") is None:
        return Yield()  # stays live until told to go (or cancelled)
    if c.fail:
        raise RuntimeError(f"child {c.n} broke")
    c.square = c.n * c.n
    return None


kid.terminal("DONE")


class Fan(msgspec.Struct):
    key: str
    n: int
    wait: str | int = "all"
    fail: list[int] = []
    hold: list[int] = []
    outcomes: list[tuple[str, str | None, int | None, str | None]] = []


def _wait(value: str | int) -> Literal["all", "any"] | int:
    return value if isinstance(value, int) else ("any" if value == "any" else "all")


fan = Machine("fan", checkpoint=Fan, key=lambda c: c.key)


@fan.state(initial=True, on_success="DONE", on_failure="FAILED", continue_run=False, children=kid,
           max_visits=3)  # fmt: skip
async def FAN_OUT(c: Fan, ctx: StepContext) -> Yield | None:
    if not ctx.children:  # the first visit fans out and waits, holding no worker
        for i in range(c.n):
            ctx.start(kid, Kid(key=f"{c.key}-{i}", n=i, fail=i in c.fail, hold=i in c.hold))
        return Yield(children=_wait(c.wait))
    c.outcomes = [
        (ch.key, ch.status, ch.checkpoint.square if ch.ended else None, ch.error_code) for ch in ctx.children
    ]
    return None


fan.terminal("DONE")


class Mid(msgspec.Struct):
    key: str


mid = Machine("mid", checkpoint=Mid, key=lambda c: c.key)


@mid.state(initial=True, on_success="DONE", on_failure="FAILED", continue_run=False, children=(kid, "mid"),
           max_visits=3)  # fmt: skip
async def SPAWN(c: Mid, ctx: StepContext) -> Yield | None:
    if ctx.children:
        return None
    if c.key.count("/") < 1:  # the top starts a middle run, which starts held kids
        ctx.start(mid, Mid(key=f"{c.key}/m"))
    else:
        for i in range(3):
            ctx.start(kid, Kid(key=f"{c.key}-{i}", n=i, hold=True))
    return Yield(children="all")


mid.terminal("DONE")


class Bad(msgspec.Struct):
    key: str
    how: str


bad = Machine("bad", checkpoint=Bad, key=lambda c: c.key)
ghost = Machine("ghost", checkpoint=Kid, key=lambda c: c.key)  # never included in the bus


@bad.state(initial=True, on_success="DONE", on_failure="FAILED", continue_run=False,
           children=(kid, "ghost"), max_visits=2)  # fmt: skip
async def TRY(c: Bad, ctx: StepContext) -> Yield | None:
    if c.how == "no-children":
        return Yield(children="all")
    if c.how == "too-many":
        ctx.start(kid, Kid(key=f"{c.key}-0", n=0))
        return Yield(children=2)
    if c.how == "undeclared":
        ctx.start(fan, Fan(key="x", n=1))
    if c.how == "unknown":
        ctx.start(ghost, Kid(key="g", n=1))
    return None


bad.terminal("DONE")


@pytest.fixture
async def cbus(bus: Bus) -> Bus:
    for m in (kid, fan, mid, bad):
        bus.include(m)
    return bus


async def test_fan_out_and_in_on_all_with_every_outcome_readable(cbus: Bus) -> None:
    await cbus.workflows.start(fan, Fan(key="all", n=5, fail=[3]))
    await finish(cbus, fan, ["all"], timeout=15)
    parent = await cbus.workflows.instance(fan, "all")
    assert (parent.state, parent.status, parent.visits) == ("DONE", "completed", {"FAN_OUT": 2}), (
        "one visit to fan out, one after the last child ended: the wait held no worker"
    )
    assert parent.checkpoint.outcomes == [
        ("all-0", "completed", 0, None),
        ("all-1", "completed", 1, None),
        ("all-2", "completed", 4, None),
        ("all-3", "failed", None, "RuntimeError"),
        ("all-4", "completed", 16, None),
    ], "a failed child is an outcome of the parent, not a crash of it"
    children = await cbus.workflows.children(fan, "all")
    assert [(c.key, c.status, c.state, c.ok, c.started) for c in children][2:4] == [
        ("all-2", "completed", "DONE", True, True),
        ("all-3", "failed", "FAILED", False, True),
    ]
    assert children[2].checkpoint == Kid(key="all-2", n=2, square=4) and children[3].error is not None
    history = await cbus.workflows.history(fan, "all")
    assert [(h.outcome, h.yielded) for h in history] == [("yield", True), ("ok", False)]


async def test_any_wakes_the_parent_when_the_first_child_ends(cbus: Bus) -> None:
    await cbus.workflows.start(fan, Fan(key="any", n=3, wait="any", hold=[0, 1]))
    await finish(cbus, fan, ["any"], timeout=15)
    parent = await cbus.workflows.instance(fan, "any")
    assert parent.checkpoint.outcomes == [
        ("any-0", None, None, None),
        ("any-1", None, None, None),
        ("any-2", "completed", 4, None),
    ], "the held children are still live when the parent goes on"
    assert (await cbus.workflows.instance(kid, "any-0")).status == "waiting"


async def test_a_count_wakes_the_parent_when_that_many_ended(cbus: Bus) -> None:
    await cbus.workflows.start(fan, Fan(key="two", n=4, wait=2, hold=[0, 3]))
    await finish(cbus, fan, ["two"], timeout=15)
    outcomes = (await cbus.workflows.instance(fan, "two")).checkpoint.outcomes
    assert [status for _, status, _, _ in outcomes] == [None, "completed", "completed", None]


async def test_cancelling_the_parent_cancels_its_live_children_and_theirs(cbus: Bus) -> None:
    await cbus.workflows.start(mid, Mid(key="top"))
    kids = [f"top/m-{i}" for i in range(3)]

    async def all_held() -> bool:
        for key in kids:
            found = await cbus.workflows.instances(kid, status="waiting")
            if key not in {i.key for i in found}:
                return False
        return await status_is(cbus, mid, "top/m", "waiting")

    await run_until(cbus, all_held, timeout=15)
    await cbus.workflows.cancel(mid, "top", reason="no longer needed")
    assert (await cbus.workflows.instance(mid, "top")).status == "cancelled"
    middle = await cbus.workflows.instance(mid, "top/m")
    assert (middle.state, middle.status) == ("CANCELLED", "cancelled")
    for key in kids:
        child = await cbus.workflows.instance(kid, key)
        assert (child.state, child.status) == ("CANCELLED", "cancelled")
        last = (await cbus.workflows.history(kid, key))[-1]
        assert (last.outcome, last.state, last.actor) == ("cancel", "WORK", "parent:mid/top")
    assert (await cbus.workflows.history(mid, "top/m"))[-1].actor == "parent:mid/top"


async def test_bad_waits_and_starts_take_the_failure_edge_with_a_typed_error(cbus: Bus) -> None:
    hows = ["no-children", "too-many", "undeclared", "unknown"]
    for how in hows:
        await cbus.workflows.start(bad, Bad(key=how, how=how))
    await finish(cbus, bad, hows, timeout=15)
    errors = {}
    for how in hows:
        inst = await cbus.workflows.instance(bad, how)
        assert inst.status == "failed"
        errors[how] = (inst.last_error_code, inst.last_error)
    assert errors["no-children"][0] == "InvalidOutcome" and "started no children" in str(
        errors["no-children"][1]
    )
    assert errors["too-many"][0] == "InvalidOutcome" and "1 are live" in str(errors["too-many"][1])
    assert errors["undeclared"][0] == "ConfigurationError" and "children=" in str(errors["undeclared"][1])
    assert errors["unknown"][0] == "UnknownMachine"
    started = await cbus.workflows.instances(kid)
    assert [i.key for i in started if i.key.startswith("too-many")] == [], (
        "a visit that fails starts no child"
    )
    with pytest.raises(InvalidOutcome):
        Yield(children=0)
    with pytest.raises(InvalidOutcome):
        Yield(children="some")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError):
        fan.state(on_success="DONE", on_failure="DONE", children=7)  # type: ignore[arg-type]


def test_the_diagram_draws_child_edges() -> None:
    text = diagram(fan)
    assert 'state "machine kid" as child_kid' in text and "FAN_OUT --> child_kid : starts, waits" in text
    dot = diagram(mid, "dot")
    assert "SPAWN -> child_kid" in dot and "SPAWN -> child_mid" in dot and "shape=component" in dot
    assert fan.definition()["states"]["FAN_OUT"]["children"] == ["kid"]
    assert "children" not in kid.definition()["states"]["WORK"], "a state without children hashes as before"


# -- the store: the wake-up guarded in SQL -----------------------------------------------------


def _move(machine: str, key: str, expected: int, **options: Any) -> WorkflowTransition:
    return WorkflowTransition(
        machine=machine, key=key, expected_version=expected, run_id=1, state="W", status="waiting",
        visits={"W": 1}, checkpoint=b"{}", entered=False,
        history=WorkflowHistoryEntry(state="W", visit=1, outcome="yield", actor="test"), **options,
    )  # fmt: skip


def _end(key: str) -> WorkflowTransition:
    return msgspec.structs.replace(_move("c", key, 1), state="DONE", status="completed")


async def _wakes(bus: Bus, key: str) -> int:
    """How many children wake-ups were published for the parent ``key``."""
    backend: Any = bus.backend
    pattern = f"wf/p/{key}/v%/children"
    if bus.backend.kind == "postgres":
        async with backend.db.conn() as conn:
            sql = f'SELECT count(*) FROM "{backend.schema_name}".events WHERE key LIKE $1'
            return int(await conn.fetchval(sql, pattern))
    sql = "SELECT count(*) FROM events WHERE key LIKE ?"
    return int(await backend.db.read(lambda c: c.execute(sql, (pattern,)).fetchone()[0]))


async def test_many_children_ending_at_once_wake_the_parent_exactly_once(bus: Bus) -> None:
    store = bus.backend.workflows
    await store.start("p", "par", "W", b"{}")
    starts = tuple(WorkflowStart("c", f"c{i}", "W", b"{}") for i in range(40))
    assert await store.commit(_move("p", "par", 1, starts=starts, children_wait=ALL_CHILDREN)) == 2
    facts = (await store.facts("p", ["par"]))["par"]
    assert (len(facts.children), facts.instance.children_wait, facts.instance.children_ended) == (40, 40, 0)

    async def end(keys: list[str]) -> None:
        await store.commit_many([_end(k) for k in keys])

    async with anyio.create_task_group() as tg:  # 39 ends, concurrently, in batches of 1 to 3
        keys = [f"c{i}" for i in range(39)]
        for i in range(0, 39, 3):
            tg.start_soon(end, keys[i : i + 3])
    assert await _wakes(bus, "par") == 0, "no wake-up before the last child ended"
    await store.commit(_end("c39"))
    assert await _wakes(bus, "par") == 1
    parent = (await store.facts("p", ["par"]))["par"]
    assert parent.instance.children_ended == 40
    assert {c.status for c in parent.children} == {"completed"}


async def test_children_that_ended_before_the_wait_make_it_due_at_once(bus: Bus) -> None:
    store = bus.backend.workflows
    await store.start("p", "early", "W", b"{}")
    starts = tuple(WorkflowStart("c", f"e{i}", "W", b"{}") for i in range(3))
    started = msgspec.structs.replace(_move("p", "early", 1, starts=starts), status="running", step="next")
    assert await store.commit(started) == 2
    await store.commit_many([_end(f"e{i}") for i in range(3)])
    assert await _wakes(bus, "early") == 0, "nobody waits yet"
    assert await store.commit(_move("p", "early", 2, children_wait=ALL_CHILDREN)) == 3
    assert await _wakes(bus, "early") == 1, "the wait is due as it commits: no lost wake-up"


tfan = Machine("tfan", checkpoint=Fan, key=lambda c: c.key)


@tfan.state(initial=True, on_success="DONE", on_failure="FAILED", continue_run=False, children=kid,
            max_visits=3, transactional=True)  # fmt: skip
async def T_FAN(c: Fan, ctx: StepContext) -> Yield | None:
    assert ctx.connection is not None
    if not ctx.children:
        for i in range(c.n):
            ctx.start(kid, Kid(key=f"{c.key}-{i}", n=i))
        return Yield(children="all")
    c.outcomes = [(ch.key, ch.status, ch.checkpoint.square, ch.error_code) for ch in ctx.children]
    return None


tfan.terminal("DONE")


@pytest.mark.pooler  # the state's transaction spans statements
async def test_a_transactional_state_starts_its_children_in_its_transaction(bus: Bus) -> None:
    bus.include(kid)
    bus.include(tfan)
    await bus.workflows.start(tfan, Fan(key="tx", n=2))
    await finish(bus, tfan, ["tx"], timeout=15)
    done = await bus.workflows.instance(tfan, "tx")
    assert done.checkpoint.outcomes == [("tx-0", "completed", 0, None), ("tx-1", "completed", 1, None)]


async def test_a_live_or_completed_run_of_the_key_is_linked_not_started_again(bus: Bus) -> None:
    store = bus.backend.workflows
    await store.start("c", "live", "W", b"{}")  # someone else's run, live
    await store.start("c", "over", "W", b"{}")
    assert await store.commit(_end("over")) == 2  # a run that completed
    await store.start("p", "adopt", "W", b"{}")
    starts = (
        WorkflowStart("c", "live", "W", b"{}"),
        WorkflowStart("c", "over", "W", b"{}", once=True),
        WorkflowStart("c", "new", "W", b"{}"),
    )
    assert await store.commit(_move("p", "adopt", 1, starts=starts, children_wait=ALL_CHILDREN)) == 2
    facts = (await store.facts("p", ["adopt"]))["adopt"]
    assert [(c.key, c.started, c.status) for c in facts.children] == [
        ("live", False, None),
        ("over", False, "completed"),
        ("new", True, None),
    ]
    assert (facts.instance.children_ended, facts.instance.children_wait) == (1, 3)
    assert (await store.load("c", "live")).version == 1, "the live run was left alone"  # type: ignore[union-attr]
    cancel = msgspec.structs.replace(_move("p", "adopt", 2), state="CANCELLED", status="cancelled")
    assert await store.commit(cancel) == 3
    live, new = await store.load("c", "live"), await store.load("c", "new")
    assert live is not None and new is not None
    assert (live.status, new.status) == ("pending", "cancelled"), (
        "only the run the parent started is cancelled"
    )
