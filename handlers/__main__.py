"""Run the example end to end: ``python -m handlers``.

Publishes three orders (one over the card limit), drains them with a burst
worker, then prints the status table and the dead-letter queue.
"""

from __future__ import annotations

import anyio

from eventbus import Envelope, Worker
from schemas import OrderPlaced

from .app import bus


async def main() -> None:
    await bus.migrate()  # the schema is created or brought up to date explicitly
    async with bus:
        results = await bus.publish_many(
            [
                Envelope(OrderPlaced(order_id="o-1", customer="ada", amount_cents=1_999), key="o-1"),
                Envelope(OrderPlaced(order_id="o-2", customer="bob", amount_cents=4_500), key="o-2"),
                Envelope(OrderPlaced(order_id="o-3", customer="eve", amount_cents=99_000), key="o-3"),
            ]
        )
        fresh = sum(not r.duplicate for r in results)
        print(f"published {fresh} new orders ({len(results) - fresh} already known) to {bus.dsn}")
        worker = Worker(bus, burst=True)
        with anyio.fail_after(60):
            while True:  # burst until the payment retries have run out too
                await worker.run()
                report = await bus.status()
                if not any(r.status in ("pending", "processing") for r in report.rows):
                    break
                await anyio.sleep(0.3)
                worker = Worker(bus, burst=True)
        print(f"\n{'SUBSCRIPTION':<28} {'STATUS':<10} COUNT")
        for row in report.rows:
            print(f"{row.subscription:<28} {row.status:<10} {row.count}")
        for dead in await bus.dead_letters():
            detail = await bus.delivery(dead.id)
            print(
                f"\ndead-letter delivery {dead.id} ({dead.subscription}) after "
                f"{dead.attempts} attempts: {dead.last_error}"
            )
            for attempt in detail.history:
                print(f"  attempt {attempt.attempt}: {attempt.error_type}: {attempt.message}")
        print("\ninspect with: eventbus status | eventbus dlq list | eventbus dlq show ID")


if __name__ == "__main__":
    anyio.run(main)
