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
from eventbus.backends.base import Failure

from ..apps.ordered_app import Step, read_records, router
from ..conftest import Target
from ..support.helpers import counts
from ..support.processes import EVENTBUS, Proc, ProcessGroup

APP = "tests.apps.ordered_app:bus"
HOLDER = "00000000-0000-4000-8000-000000000002"
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
async def test_an_interrupted_or_recovered_head_keeps_its_place(
    bus: Bus, target: Target, procs: ProcessGroup, tmp_path: Path, how: str
) -> None:
    """SIGTERM cuts the running head off after the grace (a failed attempt, retried
    after 0.2 s); SIGKILL leaves it to lease recovery. Either way it runs first."""
    records = tmp_path / "records"
    await _publish(bus, ["k"], 5)
    first = _worker(procs, target, records, "--grace", "0.2", ORD_SLOW_SEQ="0", ORD_LEASE="1")
    await _until(_has(records, "start", "k", 0), 20, procs)
    first.signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    assert await first.wait_async(15) is not None
    await anyio.sleep(0.5 if how == "sigterm" else 1.5)  # the retry is due / the lease ran out
    second = _worker(procs, target, records, "--burst", ORD_LEASE="1")
    assert await second.wait_async(30) == 0, second.output()
    assert _done_order(read_records(str(records))) == {"k": [0, 1, 2, 3, 4]}
    head = [r for r in read_records(str(records)) if r[:3] == ("start", "k", 0)]
    assert [(r[3], r[4]) for r in head] == [(1, first.pid), (2, second.pid)]


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


@pytest.mark.parametrize("how", ["release", "recovery", "retry"])
async def test_an_idle_peer_picks_up_a_handed_back_delivery_before_its_poll(
    bus: Bus, target: Target, procs: ProcessGroup, tmp_path: Path, how: str
) -> None:
    """The test holds a claim as a worker would, then hands it back (release) or lets
    its lease run out and recovers it, or fails it for a retry in 0.3 s; the peer,
    polling every 30 s, must not wait for its poll."""
    records = tmp_path / "records"
    (sub_id,) = (await bus.register()).values()
    await _publish(bus, ["x"], 1)
    # Held however long a busy machine takes to start the peer; cut short when it is to run out.
    (held,) = await bus.backend.deliveries.claim(sub_id, 1, 120.0, HOLDER, True)
    peer = _worker(procs, target, records, "--poll-interval", "30", "--recovery-interval", "30")
    await _publish(bus, ["warm-up"], 1)
    await _until(_has(records, "done", "warm-up", 0), 20, procs)
    await anyio.sleep(1.0)  # the peer is idle now, waiting up to 30 s
    assert not _has(records, "start", "x", 0)()
    if how == "release":
        assert await bus.backend.deliveries.release([held.id], held.lease_token) == 1
    elif how == "retry":
        retry = Failure(held.id, held.lease_token, False, 0.3, "Boom", "boom", "", 0.0, HOLDER)
        assert await bus.backend.deliveries.fail([retry]) == {(held.id, held.lease_token)}
    else:
        assert await bus.backend.deliveries.extend([held.id], held.lease_token, 0.2) == {held.id}
        await anyio.sleep(0.4)
        assert await bus.backend.deliveries.recover_expired() == 1
    handed_back = time.monotonic()
    await _until(_has(records, "done", "x", 0), 10, procs)
    assert time.monotonic() - handed_back < 5.0
    assert [r[4] for r in read_records(str(records)) if r[:2] == ("done", "x")] == [peer.pid]
