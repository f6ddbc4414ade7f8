"""A publishing process for the SQLite tests: prints each acknowledged publish.

    python -m tests.apps.sqlite_publisher --prefix p0 --count 1000 [--batch 20]
        [--audits 0.25] [--pad 0] [--pace 0] [--seconds 0]

The bus comes from ``EVENTBUS_DSN``. Publishes ``Job`` events keyed
``<prefix>-<i>`` (every ``1/audits``-th one an ``Audit`` instead), one at a
time or ``--batch`` at a time through ``publish_many``, and after each
publish *returns* writes ``ack <event_type> <key> <event_id>`` per event to
stdout and flushes: a line on stdout is a publish the bus acknowledged. Any
exception goes to stderr and the exit status is 1. ``--seconds`` stops
after that long (0: after ``--count`` events).
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from eventbus import Bus, Envelope

from .sqlite_events import Audit, Job


async def main(args: argparse.Namespace) -> None:
    every = round(1 / args.audits) if args.audits else 0
    pad = "x" * args.pad
    deadline = time.monotonic() + args.seconds if args.seconds else None
    async with Bus() as bus:
        i = 0
        while i < args.count and (deadline is None or time.monotonic() < deadline):
            batch = []
            for n in range(i, min(args.count, i + args.batch)):
                key = f"{args.prefix}-{n}"
                event = Audit(n=n) if every and n % every == every - 1 else Job(n=n, pad=pad)
                batch.append(Envelope(event, key=key))
            i += len(batch)
            if len(batch) == 1:
                e = batch[0]
                results = [await bus.publish(e.event, key=e.key)]
            else:
                results = await bus.publish_many(batch)
            sys.stdout.write(
                "".join(
                    f"ack {type(e.event).__name__} {e.key} {r.event_id}\n"
                    for e, r in zip(batch, results, strict=True)
                )
            )
            sys.stdout.flush()
            if args.pace:
                await anyio.sleep(args.pace)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--audits", type=float, default=0.0)
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=0.0)
    anyio.run(main, parser.parse_args())
