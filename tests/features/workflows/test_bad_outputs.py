"""A state's bad output (a checkpoint or outcome that cannot be committed) is one failure transition.

Each case runs its state function exactly once and records the error in the
history; none escapes to re-run the state outside the table.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import msgspec
import pytest

from eventbus import Bus
from eventbus.errors import ConfigurationError, InvalidCheckpoint, InvalidOutcome
from eventbus.workflows import FAILED, Approval, Fail, Machine, StepContext, Yield

from ._support import finish, run_until


class Out(msgspec.Struct):
    key: str
    count: int = 0


runs: dict[str, int] = {}
"""How many times the misbehaving state ran, by key."""


class Boom(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


async def misbehave(c: Out, ctx: StepContext) -> object:
    runs[c.key] = runs.get(c.key, 0) + 1
    match c.key:
        case "wrong-type":
            c.count = "three"  # type: ignore[assignment]  # msgspec encodes it; nothing could read it back
        case "unencodable":
            c.count = object()  # type: ignore[assignment]
        case "poll-negative":
            return Yield(poll=-1)
        case "poll-nan":
            return Yield(poll=float("nan"))
        case "poll-huge":
            return Yield(poll=timedelta(days=365 * 1000))
        case "nul":
            raise RuntimeError("the provider said \x00 and hung up")
        case "fail-int":
            return Fail(402)  # type: ignore[arg-type]
        case "fail-nul":
            return Fail("declined\x00", "card \x00 declined")
        case "bad-str":
            raise Boom
    return None


bad = Machine("bad", checkpoint=Out, key=lambda c: c.key)
bad.state(initial=True, on_success="DONE", on_failure="CAUGHT", continue_run=False, poll=60.0, name="ACT")(
    misbehave
)


@bad.state(on_success="DONE", on_failure="DONE")
async def CAUGHT(c: Out, ctx: StepContext) -> None:
    return None


bad.terminal("DONE")


def _input(c: Out) -> object:
    runs[c.key] = runs.get(c.key, 0) + 1
    raise ValueError(f"no input for {c.key}")


gated = Machine("gated", checkpoint=Out, key=lambda c: c.key)
gated.state(
    initial=True, on_success="DONE", on_failure="CAUGHT", name="ACT",
    approval=Approval(timeout=60.0, on_deny="DONE", on_timeout="DONE", input=_input),
)(misbehave)  # fmt: skip
gated.state(on_success="DONE", on_failure="DONE", name="CAUGHT")(CAUGHT)
gated.terminal("DONE")

CASES = {
    "wrong-type": ("checkpoint-invalid", "does not match its type"),
    "unencodable": ("checkpoint-invalid", "does not encode"),
    "poll-negative": ("InvalidOutcome", "cannot be negative"),
    "poll-nan": ("InvalidOutcome", "finite number of seconds"),
    "poll-huge": ("InvalidOutcome", "up to 100 years"),
    "nul": ("RuntimeError", "the provider said \\x00 and hung up"),
    "fail-int": ("InvalidOutcome", "Fail code must be a non-empty str, not int 402"),
    "fail-nul": ("declined\\x00", "card \\x00 declined"),
    "bad-str": ("Boom", "Boom: (its message cannot be read)"),
}


@pytest.fixture
async def obus(bus: Bus) -> Bus:
    runs.clear()
    bus.include(bad)
    bus.include(gated)
    return bus


async def test_each_bad_output_is_one_failure_transition_with_its_error(obus: Bus) -> None:
    for key in CASES:
        await obus.workflows.start(bad, Out(key=key))
    await finish(obus, bad, list(CASES))
    for key, (code, text) in CASES.items():
        inst = await obus.workflows.instance(bad, key)
        assert (inst.state, inst.status, inst.checkpoint.count) == ("DONE", "completed", 0), key
        rows = await obus.workflows.history(bad, key)
        assert [(r.state, r.next_state) for r in rows] == [("ACT", "CAUGHT"), ("CAUGHT", "DONE")], key
        outcome = "fail" if key in ("wrong-type", "unencodable", "fail-nul") else "error"
        assert (rows[0].outcome, rows[0].error_code) == (outcome, code), key
        assert text in (rows[0].error or ""), (key, rows[0].error)
    assert runs == dict.fromkeys(CASES, 1), "each state ran once: nothing re-ran outside the table"


async def test_an_approval_input_that_raises_takes_the_failure_edge(obus: Bus) -> None:
    await obus.workflows.start(gated, Out(key="no-input"))
    await finish(obus, gated, ["no-input"])
    rows = await obus.workflows.history(gated, "no-input")
    assert [(r.state, r.visit, r.outcome, r.next_state, r.error_code) for r in rows] == [
        ("ACT", 1, "error", "CAUGHT", "ValueError"),
        ("CAUGHT", 1, "ok", "DONE", None),
    ]
    assert rows[0].error == "ValueError: no input for no-input"
    assert runs == {"no-input": 1} and await obus.workflows.approvals(gated, "no-input") == []


async def test_a_checkpoint_that_cannot_be_decoded_fails_the_run(obus: Bus) -> None:
    # A pointer written under an older checkpoint type: no state can run on it.
    _, started = await obus.backend.workflows.start("bad", "old-shape", "ACT", b'{"key": 5}')
    assert started

    async def failed() -> bool:
        row = await obus.backend.workflows.load("bad", "old-shape")
        return row is not None and row.status == "failed"

    await run_until(obus, failed)
    rows = await obus.workflows.history(bad, "old-shape")
    assert [(r.state, r.outcome, r.next_state, r.error_code) for r in rows] == [
        ("ACT", "error", FAILED, "checkpoint-undecodable")
    ]
    assert runs == {}, "the state never ran"


def test_bad_outcomes_and_checkpoints_are_refused_where_they_are_made() -> None:
    with pytest.raises(InvalidOutcome):
        Yield(poll="soon")  # type: ignore[arg-type]
    with pytest.raises(InvalidOutcome):
        Fail("")
    with pytest.raises(InvalidCheckpoint):
        bad.encode(Out(key="k", count="x"))  # type: ignore[arg-type]


async def test_a_wrongly_typed_checkpoint_is_refused_at_start(obus: Bus) -> None:
    with pytest.raises(InvalidCheckpoint):
        await obus.workflows.start(bad, Out(key="k", count="x"))  # type: ignore[arg-type]
    with anyio.fail_after(5):
        assert await obus.backend.workflows.load("bad", "k") is None


async def test_nul_in_what_an_operator_or_caller_gives_is_refused_on_both_backends(obus: Bus) -> None:
    with pytest.raises(ConfigurationError, match="no NUL"):
        await obus.workflows.start(bad, Out(key="nul\x00key"))
    await obus.workflows.start(gated, Out(key="gate"))
    with pytest.raises(ConfigurationError, match="NUL"):
        await obus.workflows.signal(gated, "gate", "go\x00")
    with pytest.raises(ConfigurationError, match="NUL"):
        await obus.workflows.approve(1, by="ann", reason="ok\x00")
