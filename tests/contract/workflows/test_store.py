"""The WorkflowStore port on both backends: guarded, batched commits."""

from __future__ import annotations

from eventbus import Bus
from eventbus.backends.base import WorkflowHistoryEntry, WorkflowTransition


def move(key: str, expected: int, **options: object) -> WorkflowTransition:
    return WorkflowTransition(
        machine="store", key=key, expected_version=expected, run_id=1, state="B", status="running",
        visits={"A": 1}, checkpoint=b'{"moved":true}', entered=True, step="next",
        history=WorkflowHistoryEntry(state="A", visit=1, outcome="ok", actor="test"), **options,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_a_batch_applies_each_guard_on_its_own(bus: Bus) -> None:
    for key in ("a", "b", "c"):
        inst, started = await bus.backend.wf_start("store", key, "A", b"{}")
        assert started and inst.version == 1
    versions = await bus.backend.wf_commit_many(
        [move("a", 1), move("b", 7), move("c", 1, lease=(10**9, "00000000-0000-0000-0000-000000000000"))]
    )
    assert versions == [2, None, None], "a stale version and a lost lease are refused, the rest applies"
    a, b = await bus.backend.wf_load("store", "a"), await bus.backend.wf_load("store", "b")
    assert a is not None and (a.state, a.version, a.checkpoint) == ("B", 2, b'{"moved":true}')
    assert b is not None and (b.state, b.version) == ("A", 1)
    assert [h.version for h in await bus.backend.wf_history("store", "a")] == [2]
    assert await bus.backend.wf_history("store", "b") == []
    assert await bus.backend.wf_commit_many([move("a", 1)]) == [None], "the same transition twice: a no-op"
    again, started = await bus.backend.wf_start("store", "a", "A", b"{}")
    assert not started and again.version == 2, "start is idempotent while the run is live"


async def test_load_many_reads_the_pointers_of_several_keys(bus: Bus) -> None:
    for key in ("x", "y"):
        await bus.backend.wf_start("store", key, "A", b"{}")
    await bus.backend.wf_signal("store", "y", "go", b"1", None, [])
    found = await bus.backend.wf_load_many("store", ["x", "y", "absent"])
    assert sorted(found) == ["x", "y"]
    assert (found["x"].has_signals, found["y"].has_signals) == (False, True)
    single = await bus.backend.wf_load("store", "x")
    assert single is not None and (single.state, single.version) == (found["x"].state, found["x"].version)
