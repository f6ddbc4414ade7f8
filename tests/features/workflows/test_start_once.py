"""Runs that start once, ever: ``start(..., once=True)``, and ``ctx.start`` with a delivery."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from eventbus import Bus, ConfigurationError, Context, Event, RetryPolicy, UnknownMachine
from eventbus.backends.base import Completion
from eventbus.workflows import FAILED, Machine, StepContext

from ...conftest import BusFactory
from ...support.helpers import drain


class Video(msgspec.Struct):
    digest: str
    fail: bool = False


class VideoUploaded(Event, event_type="test.video_uploaded"):
    digest: str


processed: list[str] = []

encode = Machine("encode", checkpoint=Video, key=lambda c: c.digest)


@encode.state(initial=True, on_success="DONE", on_failure=FAILED)
async def PROCESS(c: Video, ctx: StepContext) -> None:
    processed.append(c.digest)
    if c.fail:
        raise RuntimeError("the encoder crashed")


encode.terminal("DONE")


@pytest.fixture
async def ebus(make_bus: BusFactory) -> Bus:
    processed.clear()
    bus = await make_bus()
    bus.include(encode)
    return bus


async def test_once_returns_the_completed_run_and_starts_nothing(ebus: Bus) -> None:
    first = await ebus.workflows.start(encode, Video("v-1"), once=True)
    assert first.started and not first.done and (first.run_id, first.state) == (1, "PROCESS")
    assert (await ebus.backend.workflows.load("encode", "v-1")).kept  # type: ignore[union-attr]
    await drain(ebus)
    again = await ebus.workflows.start(encode, Video("v-1"), once=True)
    assert not again.started and again.done
    assert (again.run_id, again.status, again.state, again.version) == (1, "completed", "DONE", 2)
    await drain(ebus)
    assert processed == ["v-1"], "the completed run was not run again"
    assert [h.version for h in await ebus.workflows.history(encode, "v-1")] == [2]
    rerun = await ebus.workflows.start(encode, Video("v-1"))
    assert rerun.started and rerun.run_id == 2, "without once, a finished key starts a new run"


async def test_once_marks_kept_a_run_completed_without_it(ebus: Bus) -> None:
    await ebus.workflows.start(encode, Video("v-8"))
    await drain(ebus)
    assert not (await ebus.backend.workflows.load("encode", "v-8")).kept  # type: ignore[union-attr]
    refused = await ebus.workflows.start(encode, Video("v-8"), once=True)
    assert refused.done and refused.run_id == 1
    assert (await ebus.backend.workflows.load("encode", "v-8")).kept, (  # type: ignore[union-attr]
        "retention must now keep the completed run that refuses starts"
    )


async def test_once_starts_again_a_run_that_failed(ebus: Bus) -> None:
    await ebus.workflows.start(encode, Video("v-2", fail=True), once=True)
    await drain(ebus)
    assert (await ebus.workflows.instance(encode, "v-2")).status == "failed"
    retry = await ebus.workflows.start(encode, Video("v-2"), once=True)
    assert retry.started and not retry.done and retry.run_id == 2
    await drain(ebus)
    assert (await ebus.workflows.instance(encode, "v-2")).status == "completed"
    assert not (await ebus.workflows.start(encode, Video("v-2"), once=True)).started
    assert processed == ["v-2", "v-2"]


async def test_concurrent_starts_once_start_one_run(ebus: Bus, make_bus: BusFactory) -> None:
    other = await make_bus()
    other.include(encode)
    buses = [ebus, other] * 5

    async def start_all(digest: str, fail: bool = False) -> list[bool]:
        started: list[bool] = []

        async def one(bus: Bus) -> None:
            started.append((await bus.workflows.start(encode, Video(digest, fail), once=True)).started)

        async with anyio.create_task_group() as tg:
            for bus in buses:
                tg.start_soon(one, bus)
        return started

    assert sorted(await start_all("v-3")) == [False] * 9 + [True], "a new key: one start wins"
    await drain(ebus)
    assert await start_all("v-3") == [False] * 10, "a completed key: none starts"
    await ebus.workflows.start(encode, Video("v-4", fail=True))
    await drain(ebus)
    assert sorted(await start_all("v-4")) == [False] * 9 + [True], "a failed key: one new run"
    await drain(ebus)
    assert processed.count("v-3") == 1 and processed.count("v-4") == 2
    assert (await ebus.workflows.instance(encode, "v-4")).run_id == 2


async def test_a_handler_starts_a_run_with_its_completion_once_across_retries(ebus: Bus) -> None:
    attempts: list[int] = []

    @ebus.subscribe(VideoUploaded, name="uploads", retry=RetryPolicy(max_attempts=3, base_delay_seconds=0.01))
    async def uploaded(event: VideoUploaded, ctx: Context) -> None:
        ctx.start(encode, Video(event.digest), once=True)
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the handler fails after asking for the start")

    await ebus.publish(VideoUploaded(digest="v-5"))
    await drain(ebus)
    assert attempts == [1, 2]
    inst = await ebus.workflows.instance(encode, "v-5")
    assert (inst.run_id, inst.status) == (1, "completed")
    assert processed == ["v-5"], "the failed attempt started nothing; the retry started one run"
    await ebus.publish(VideoUploaded(digest="v-5"))
    await drain(ebus)
    assert (await ebus.workflows.instance(encode, "v-5")).run_id == 1, "once: the same video is not redone"
    assert processed == ["v-5"]


async def test_many_handlers_start_in_batched_completions_one_run_per_key(ebus: Bus) -> None:
    @ebus.subscribe(VideoUploaded, name="uploads")
    async def uploaded(event: VideoUploaded, ctx: Context) -> None:
        ctx.start(encode, Video(event.digest), once=True)

    await ebus.register()
    await ebus.publish_many([VideoUploaded(digest=f"b-{i % 10}") for i in range(30)])
    await drain(ebus, concurrency=30)
    runs = await ebus.workflows.instances(encode)
    assert sorted(i.key for i in runs) == [f"b-{i}" for i in range(10)]
    assert {(i.run_id, i.status) for i in runs} == {(1, "completed")}
    assert sorted(processed) == sorted(f"b-{i}" for i in range(10)), "three uploads of a key: one run"


async def test_a_completion_refused_for_a_lost_lease_starts_nothing(ebus: Bus) -> None:
    @ebus.subscribe(VideoUploaded, name="uploads", lease_seconds=0.2)
    async def uploaded(event: VideoUploaded, ctx: Context) -> None:
        ctx.start(encode, Video(event.digest))

    await drain(ebus)  # registers the subscriptions
    await ebus.publish(VideoUploaded(digest="v-6"))
    worker = "00000000-0000-4000-8000-00000000000a"
    ids = await ebus.register(["uploads"])
    (old,) = await ebus.backend.deliveries.claim(ids["uploads"], 1, 0.2, worker)
    await anyio.sleep(0.3)
    assert await ebus.backend.deliveries.recover_expired() == 1
    (new,) = await ebus.backend.deliveries.claim(ids["uploads"], 1, 30, worker)
    start = ebus.workflows.prepare(encode, Video("v-6"))
    stale = Completion(old.id, old.lease_token, (), (start,))
    assert await ebus.backend.deliveries.complete([stale]) == set()
    assert await ebus.backend.workflows.load("encode", "v-6") is None, "the stale completion started nothing"
    assert await ebus.backend.deliveries.complete([Completion(new.id, new.lease_token, (), (start,))]) == {
        (new.id, new.lease_token)
    }
    await drain(ebus)
    assert processed == ["v-6"] and (await ebus.workflows.instance(encode, "v-6")).status == "completed"


async def test_ctx_start_checks_the_checkpoint_in_the_handler(ebus: Bus) -> None:
    errors: list[type[Exception]] = []

    @ebus.subscribe(VideoUploaded, name="uploads", retry=RetryPolicy(max_attempts=1))
    async def uploaded(event: VideoUploaded, ctx: Context) -> None:
        for machine, checkpoint in (("encode", "not a video"), ("absent", Video("x")), (encode, Video(""))):
            try:
                ctx.start(machine, checkpoint)
            except (ConfigurationError, UnknownMachine) as exc:
                errors.append(type(exc))

    await ebus.publish(VideoUploaded(digest="v-7"))
    await drain(ebus)
    assert errors == [ConfigurationError, UnknownMachine, ConfigurationError]
    assert await ebus.workflows.instances(encode) == []


async def test_a_transactional_handler_starts_a_run_in_its_own_transaction(ebus: Bus) -> None:
    """``ctx.start`` from a transactional handler: written in the transaction the handler writes in
    (on SQLite the writer the handler holds), and only by the attempt that commits."""
    attempts: list[int] = []

    @ebus.subscribe(
        VideoUploaded,
        name="uploads",
        transactional=True,
        retry=RetryPolicy(max_attempts=3, base_delay_seconds=0.01),
    )
    async def uploaded(event: VideoUploaded, ctx: Context) -> None:
        assert ctx.connection is not None
        ctx.start(encode, Video(event.digest), once=True)
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the handler fails after asking for the start")

    await ebus.publish(VideoUploaded(digest="v-9"))
    await drain(ebus)
    assert attempts == [1, 2]
    inst = await ebus.workflows.instance(encode, "v-9")
    assert (inst.run_id, inst.status) == (1, "completed")
    assert processed == ["v-9"]
