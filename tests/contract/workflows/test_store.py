"""The WorkflowStore port on both backends: guarded, batched commits."""

from __future__ import annotations

import msgspec

from eventbus import Bus
from eventbus.backends.base import (
    WorkflowApprovalRequest,
    WorkflowEffect,
    WorkflowHistoryEntry,
    WorkflowTransition,
)


def move(key: str, expected: int, **options: object) -> WorkflowTransition:
    return WorkflowTransition(
        machine="store", key=key, expected_version=expected, run_id=1, state="B", status="running",
        visits={"A": 1}, checkpoint=b'{"moved":true}', entered=True, step="next",
        history=WorkflowHistoryEntry(state="A", visit=1, outcome="ok", actor="test"), **options,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_a_batch_applies_each_guard_on_its_own(bus: Bus) -> None:
    for key in ("a", "b", "c"):
        inst, started = await bus.backend.workflows.start("store", key, "A", b"{}")
        assert started and inst.version == 1
    versions = await bus.backend.workflows.commit_many(
        [move("a", 1), move("b", 7), move("c", 1, lease=(10**9, "00000000-0000-0000-0000-000000000000"))]
    )
    assert versions == [2, None, None], "a stale version and a lost lease are refused, the rest applies"
    a, b = await bus.backend.workflows.load("store", "a"), await bus.backend.workflows.load("store", "b")
    assert a is not None and (a.state, a.version, a.checkpoint) == ("B", 2, b'{"moved":true}')
    assert b is not None and (b.state, b.version) == ("A", 1)
    assert [h.version for h in await bus.backend.workflows.history("store", "a")] == [2]
    assert await bus.backend.workflows.history("store", "b") == []
    assert await bus.backend.workflows.commit_many([move("a", 1)]) == [None], (
        "the same transition twice: a no-op"
    )
    again, started = await bus.backend.workflows.start("store", "a", "A", b"{}")
    assert not started and again.version == 2, "start is idempotent while the run is live"


async def test_facts_read_the_pointers_with_what_is_open_for_their_runs(bus: Bus) -> None:
    store = bus.backend.workflows
    for key in ("x", "y", "z"):
        await store.start("store", key, "A", b"{}")
    for payload in (b"1", b"2"):
        await store.signal("store", "y", "go", payload, None, [])
    effect = WorkflowEffect("A", "store/x/1/A/1/0", "card.charged", '{"charge": "c-1"}', "refund")
    request = WorkflowApprovalRequest("A", b'"input"', "h" * 64, 60.0)
    assert await store.commit_many(
        [move("x", 1, effects=(effect,)), move("z", 1, approval_request=request)]
    ) == [
        2,
        2,
    ]
    found = await store.facts("store", ["x", "y", "z", "absent"])
    assert sorted(found) == ["x", "y", "z"]
    x, y, z = found["x"], found["y"], found["z"]
    assert (x.instance.version, x.instance.state, x.instance.has_signals, y.instance.has_signals) == (
        2, "B", False, True,
    )  # fmt: skip
    assert [s.payload for s in y.signals] == [b"1", b"2"] and x.signals == z.signals == ()
    assert [(e.kind, e.compensation, e.status) for e in x.effects] == [("card.charged", "refund", "done")]
    assert y.effects == z.effects == ()
    assert [(a.state, a.status, a.input_hash) for a in z.approvals] == [("A", "pending", "h" * 64)]
    assert x.approvals == y.approvals == ()
    single = await store.load("store", "x")
    assert single is not None and (single.state, single.version) == (x.instance.state, x.instance.version)
    assert await store.commit(move("y", 1, consume_signals=(y.signals[0].id,))) == 2
    assert [s.payload for s in (await store.facts("store", ["y"]))["y"].signals] == [b"2"], (
        "a consumed signal is no longer open"
    )


async def test_a_signal_is_stored_for_the_live_run_only(bus: Bus) -> None:
    store = bus.backend.workflows
    assert await store.signal("store", "none", "go", b"1", None, []) == "missing"
    await store.start("store", "k", "A", b"{}")
    assert await store.signal("store", "k", "go", b"1", "id-1", []) == "sent"
    assert await store.signal("store", "k", "go", b"1", "id-1", [], 1) == "duplicate"
    assert await store.signal("store", "k", "go", b"1", None, [], 2) == "missing"
    ended = move("k", 1)
    ended = msgspec.structs.replace(ended, state="DONE", status="completed")
    assert await store.commit(ended) == 2
    assert await store.signal("store", "k", "go", b"2", None, []) == "ended"
    again, started = await store.start("store", "k", "A", b"{}")
    assert started and again.run_id == 2 and not again.has_signals
    assert await store.signal("store", "k", "go", b"3", None, [], 1) == "ended"
    assert await store.signal("store", "k", "go", b"3", "id-1", []) == "sent", "dedupe is per run"
    facts = (await store.facts("store", ["k"]))["k"]
    assert facts.instance.has_signals and [(s.run_id, s.payload) for s in facts.signals] == [(2, b"3")]
    assert [(s.run_id, s.dedupe) for s in await store.signals("store", "k", False)] == [
        (1, "id-1"),
        (2, "id-1"),
    ]


async def test_the_newest_recorded_table_is_the_one_in_force(bus: Bus) -> None:
    store = bus.backend.workflows
    assert await store.definition("shape") is None
    await store.record_definition("shape", "h1", b'{"states":{"A":{"edges":{"DONE":"success"}}}}')
    await store.record_definition("other", "h9", b"{}")
    one = await store.definition("shape")
    assert one is not None and (one.machine, one.def_hash) == ("shape", "h1")
    assert one.definition == {"states": {"A": {"edges": {"DONE": "success"}}}}
    assert one.registered_at == one.first_registered_at

    await store.record_definition("shape", "h2", b'{"states":{}}')
    two = await store.definition("shape")
    assert two is not None and (two.def_hash, two.definition) == ("h2", {"states": {}})

    await store.record_definition("shape", "h1", b'{"states":{"A":{"edges":{"DONE":"success"}}}}')
    back = await store.definition("shape")
    assert back is not None and back.def_hash == "h1", "a table recorded again is in force again"
    assert back.first_registered_at == one.first_registered_at and back.registered_at > one.registered_at


async def test_capped_counts_stop_one_past_the_cap_in_each_group(bus: Bus) -> None:
    """counts(cap=N): each (state, status) group counted to min(n, N + 1), every group found."""
    store = bus.backend.workflows
    for i in range(7):
        await store.start("store", f"a{i}", "A", b"{}")
    for i in range(3):
        await store.start("store", f"b{i}", "B", b"{}")
    await store.start("store", "c0", "C", b"{}")
    await store.start("other", "a0", "A", b"{}")
    assert await store.commit_many([move("a5", 1), move("a6", 1)]) == [2, 2]  # two A pending -> B running
    exact = await store.counts("store")
    assert exact == {("A", "pending"): 5, ("B", "pending"): 3, ("C", "pending"): 1, ("B", "running"): 2}
    assert await store.counts("store", 3) == {
        ("A", "pending"): 4, ("B", "pending"): 3, ("C", "pending"): 1, ("B", "running"): 2,
    }, "a group past the cap shows as cap + 1, the others exactly"  # fmt: skip
    assert await store.counts("store", 1) == {
        ("A", "pending"): 2, ("B", "pending"): 2, ("C", "pending"): 1, ("B", "running"): 2,
    }  # fmt: skip
    assert await store.counts("store", 100) == exact
    assert await store.counts("nothing", 5) == {}
