"""Run the example end to end: ``python -m handlers``.

Publishes three orders (one over the card limit), drains them with a burst
worker, renders the invoices of the shipped orders with a pull claim (a batch
job, not a worker), then prints the status table and the dead-letter queue. Then runs the
retraining state machine for three customers against a pretend GPU service:
one trains normally, one's job fails until the visit cap ends the run, and
one's job succeeds while the model download crashes, so its next run resumes
without retraining. It prints each history and the machine's diagram. Last,
an album import fans out one child machine per photo and fans in when all
have ended, one corrupt photo among them.
"""

from __future__ import annotations

import anyio

from eventbus import Bus, Envelope, Worker
from eventbus.workflows import diagram
from schemas import Album, OrderPlaced, Retrain

from . import invoices
from .app import bus
from .gallery import album
from .gpu import gpu
from .retrain import machine

CUSTOMERS = ("acme", "globex", "initech")
UNSERVED = ("wf.retrain", invoices.SUBSCRIPTION)
"""Not drained by workers here: the machine's steps (run below), the pulled invoices (claimed below)."""


async def settled(bus: Bus, machines: bool | str) -> bool:
    if machines == "album":
        return (await bus.workflows.instance(album, "holiday")).status in ("completed", "failed")
    if machines:  # every run ended (a yielded poll is a delayed step, not runnable yet)
        statuses = [(await bus.workflows.instance(machine, c)).status for c in CUSTOMERS]
        return all(s in ("completed", "failed") for s in statuses)
    report = await bus.status()  # the order flow, payment retries included
    return not any(
        r.status in ("pending", "processing") for r in report.rows if r.subscription not in UNSERVED
    )


async def drain(bus: Bus, *, machines: bool | str = False) -> None:
    """Run burst workers until the flow has settled."""
    with anyio.fail_after(60):
        while True:
            await Worker(bus, burst=True).run()
            if await settled(bus, machines):
                return
            await anyio.sleep(0.1)


async def orders() -> None:
    results = await bus.publish_many(
        [
            Envelope(OrderPlaced(order_id="o-1", customer="ada", amount_cents=1_999), key="o-1"),
            Envelope(OrderPlaced(order_id="o-2", customer="bob", amount_cents=4_500), key="o-2"),
            Envelope(OrderPlaced(order_id="o-3", customer="eve", amount_cents=99_000), key="o-3"),
        ]
    )
    fresh = sum(not r.duplicate for r in results)
    print(f"published {fresh} new orders ({len(results) - fresh} already known) to {bus.dsn}")
    await drain(bus)
    rendered = await invoices.render_invoices(bus)  # a pull claim: no worker serves `invoices`
    print(f"invoices rendered by a batch job (pull claim): {', '.join(sorted(rendered)) or 'none'}")
    report = await bus.status()
    print(f"\n{'SUBSCRIPTION':<28} {'STATUS':<10} COUNT")
    for row in report.rows:
        if row.subscription != "wf.retrain":
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


async def retraining() -> None:
    print("\n-- durable state machine: retrain (pretend GPU service) --")
    gpu.script("acme", "succeeded", polls=3)
    gpu.script("globex", "succeeded", polls=2, crash_download=True)
    gpu.script("initech", "failed", polls=1)
    for customer in CUSTOMERS:
        await bus.workflows.start(machine, Retrain(customer=customer))
    await drain(bus, machines=True)
    crashed = await bus.workflows.instance(machine, "globex")
    resumed = await bus.workflows.start(machine, Retrain(customer="globex"))  # the next cycle: no new data
    print(f"globex: the download crashed in run {crashed.run_id}; run {resumed.run_id} resumes it")
    await drain(bus, machines=True)
    for customer in CUSTOMERS:
        inst = await bus.workflows.instance(machine, customer)
        error = f", last error: {inst.last_error}" if inst.last_error else ""
        print(f"\n{customer}: {inst.state} ({inst.status}), run {inst.run_id}, visits {inst.visits}{error}")
        first = crashed.run_id if customer == "globex" else inst.run_id
        for h in await bus.workflows.history(machine, customer):
            if h.run_id >= first:
                note = f"  [{h.error}]" if h.error else ""
                visit = f"run {h.run_id} {h.state:<17} visit {h.visit:<3}"
                print(f"  {visit} {h.outcome:<6} -> {h.next_state}{note}")
    trained = gpu.submissions.count("globex")
    print(f"\nGPU jobs submitted: {', '.join(gpu.submissions)} (globex: {trained} job for two runs)")
    print("\n" + diagram(machine, "mermaid"))
    print("inspect with: eventbus workflow --app handlers.app:bus show retrain globex")


async def albums() -> None:
    print("\n-- child machines: an album import fans out one thumbnail run per photo --")
    photos = ["beach.jpg", "dunes.jpg", "sunset.corrupt", "harbour.jpg"]
    await bus.workflows.start(album, Album(album="holiday", photos=photos))
    await drain(bus, machines="album")
    done = await bus.workflows.instance(album, "holiday")
    print(f"holiday: {done.state} ({done.status}), thumbnails {done.checkpoint.thumbnails}")
    print(f"  broken photos (failed child runs, outcomes of the album): {done.checkpoint.broken}")
    visits = done.visits.get("IMPORT", 0)
    print(f"  IMPORT visited {visits} times: once to fan out, once when the last child ended")
    print("\n" + diagram(album, "mermaid"))


async def main() -> None:
    await bus.migrate()  # the schema is created or brought up to date explicitly
    async with bus:
        await orders()
        await retraining()
        await albums()


if __name__ == "__main__":
    anyio.run(main)
