"""Per-key FIFO across real worker processes and real signals, on both backends.

The handler of ``tests.apps.ordered_app`` appends ``start``/``done`` lines to
one record file shared by every process; a key's ``done`` lines are the order
in which its deliveries were handled.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from eventbus import Bus, Envelope

from ..apps.ordered_app import Step, read_records, router
from ..conftest import Target
from ..helpers import counts
from ..processes import EVENTBUS, Proc, ProcessGroup

APP = "tests.apps.ordered_app:bus"
Records = list[tuple[str, str, int, int, int]]


@pytest.fixture
async def bus(target: Target) -> AsyncIterator[Bus]:
    b = target.bus()
    b.include(router)
    await b.migrate()
    await b.register()
    yield b
    await b.aclose()


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[ProcessGroup]:
    group = ProcessGroup(tmp_path)
    yield group
    await group.aclose()


def _worker(procs: ProcessGroup, target: Target, records: Path, *args: str, **env: str) -> Proc:
    extra = {**target.env(), "ORD_RECORDS": str(records), **env}
    return procs.spawn([EVENTBUS, "worker", APP, *args], extra, "ordered")


async def _until(what: Callable[[], bool], timeout: float, procs: ProcessGroup) -> None:
    with anyio.move_on_after(timeout):
        while not what():
            await anyio.sleep(0.02)
        return
    logs = "\n".join(p.output()[-2000:] for p in procs.all)
    raise AssertionError(f"timed out after {timeout}s; worker logs:\n{logs}")


def _has(records: Path, phase: str, key: str, seq: int) -> Callable[[], bool]:
    return lambda: any(r[:3] == (phase, key, seq) for r in read_records(str(records)))


def _done_order(records: Records) -> dict[str, list[int]]:
    order: dict[str, list[int]] = defaultdict(list)
    for phase, key, seq, _attempt, _pid in records:
        if phase == "done":
            order[key].append(seq)
    return order


async def _publish(bus: Bus, keys: list[str], per_key: int) -> None:
    await bus.publish_many(Envelope(Step(key=k, seq=i), ordering_key=k) for i in range(per_key) for k in keys)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_released_or_recovered_head_keeps_its_place(
    bus: Bus, target: Target, procs: ProcessGroup, tmp_path: Path, how: str
) -> None:
    records = tmp_path / "records"
    await _publish(bus, ["k"], 5)
    first = _worker(procs, target, records, "--grace", "0.2", ORD_SLOW_SEQ="0", ORD_LEASE="1")
    await _until(_has(records, "start", "k", 0), 20, procs)
    if how == "sigterm":
        first.signal(signal.SIGTERM)  # the running head is handed back after the grace
    else:
        first.signal(signal.SIGKILL)  # the head's lease runs out
    assert await first.wait_async(15) is not None
    if how == "sigkill":
        await anyio.sleep(1.5)
    second = _worker(procs, target, records, "--burst", ORD_LEASE="1")
    assert await second.wait_async(30) == 0, second.output()
    assert _done_order(read_records(str(records))) == {"k": [0, 1, 2, 3, 4]}
    head = [r for r in read_records(str(records)) if r[:3] == ("start", "k", 0)]
    assert [r[3] for r in head] == ([1, 1] if how == "sigterm" else [1, 2])  # a release is not an attempt


async def test_order_holds_across_worker_processes(
    bus: Bus, target: Target, procs: ProcessGroup, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    keys, per_key = [f"k{i}" for i in range(40)], 10
    for _ in range(3):  # each can hold 10 of the 40 keys at once
        _worker(procs, target, records, "--concurrency", "10", "--batch-size", "10", ORD_JITTER_MS="5")
    with anyio.fail_after(30):
        while len((await bus.status()).workers) < 3:
            await anyio.sleep(0.05)
    await _publish(bus, keys, per_key)  # all three are up and compete for it
    total = len(keys) * per_key
    await _until(lambda: _done_count(records) >= total, 90, procs)
    lines = read_records(str(records))
    assert _done_order(lines) == {k: list(range(per_key)) for k in keys}
    assert len({pid for *_, pid in lines}) > 1  # the work was shared
    _assert_no_overlap(lines)
    with anyio.fail_after(10):
        while (await counts(bus))[("fifo", "completed")] < total:
            await anyio.sleep(0.05)


def _done_count(records: Path) -> int:
    return sum(1 for r in read_records(str(records)) if r[0] == "done")


def _assert_no_overlap(lines: Records) -> None:
    """Each key's lines alternate start, done: never two of its deliveries at once."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for phase, key, *_ in lines:
        by_key[key].append(phase)
    for key, phases in by_key.items():
        assert phases == ["start", "done"] * (len(phases) // 2), key


@pytest.mark.parametrize("how", ["release", "recovery"])
async def test_an_idle_peer_picks_up_a_handed_back_delivery_before_its_poll(
    bus: Bus, target: Target, procs: ProcessGroup, tmp_path: Path, how: str
) -> None:
    records = tmp_path / "records"
    holder = _worker(
        procs, target, records, "--concurrency", "1", "--grace", "0.2", ORD_SLOW_SEQ="0", ORD_LEASE="1"
    )
    await _publish(bus, ["x"], 1)
    await _until(_has(records, "start", "x", 0), 20, procs)
    slow_poll = ["--poll-interval", "30", "--recovery-interval", "30"]
    peer = _worker(procs, target, records, *slow_poll, ORD_LEASE="1")
    await _publish(bus, ["warm-up"], 1)  # the holder is full: the peer takes it
    await _until(_has(records, "done", "warm-up", 0), 20, procs)
    await anyio.sleep(1.0)  # the peer is now idle, waiting up to 30 s
    if how == "release":
        holder.signal(signal.SIGTERM)
        assert await holder.wait_async(15) == 0, holder.output()
    else:
        holder.signal(signal.SIGKILL)
        assert await holder.wait_async(15) is not None
        await anyio.sleep(1.2)  # the lease runs out
        assert await bus.backend.recover_expired() == 1  # recovered by someone else
    handed_back = time.monotonic()
    await _until(_has(records, "done", "x", 0), 10, procs)
    assert time.monotonic() - handed_back < 5.0
    assert [r[4] for r in read_records(str(records)) if r[:2] == ("done", "x")] == [peer.pid]
