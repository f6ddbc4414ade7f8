"""``eventbus bench``: end-to-end claim throughput on the configured database.

Publishes N events beforehand in batches, refreshes the planner statistics
(as autovacuum would in steady state), then drains them with a no-op handler
in burst mode and reports events per second. PostgreSQL runs use a
scratch schema (``eventbus_bench``) that is dropped first; SQLite runs use a
temporary file.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import anyio
import click
import msgspec

from ..bus import Bus, Envelope
from ..context import Context
from ..event import Event
from ..worker import Worker
from ._common import Obj, run

__all__ = ["BenchEvent", "bench", "drain_throughput", "scratch_bus"]


class BenchEvent(Event, event_type="bench.tick"):
    n: int
    body: str = ""


async def scratch_bus(dsn: str | None, schema: str = "eventbus_bench") -> Bus:
    """A migrated, empty bus for a benchmark run: the schema is dropped first."""
    if dsn and dsn.startswith(("postgresql://", "postgres://")):
        bus = Bus(dsn, schema=schema, max_pool_size=8)
        await bus.backend.schema.drop()
    else:
        path = os.path.join(tempfile.mkdtemp(prefix="eventbus-bench-"), "bench.db")
        bus = Bus(f"sqlite:///{path}")
    await bus.migrate()
    return bus


async def drain_throughput(
    dsn: str | None,
    n: int = 20_000,
    *,
    concurrency: int = 200,
    batch_size: int = 100,
    subscriptions: int = 1,
    handler_sleep_seconds: float = 0.0,
    publish_batch: int = 1000,
    ordering_keys: int = 0,
) -> dict[str, Any]:
    """Publish ``n`` events, drain them with one worker, return rates in events/s.

    With ``ordering_keys``, the subscriptions are ordered and event ``i`` has
    ordering key ``i % ordering_keys`` (each key's events spread over the log).
    """
    bus = await scratch_bus(dsn)
    try:
        for i in range(subscriptions):

            async def handler(event: BenchEvent, ctx: Context) -> None:
                if handler_sleep_seconds:
                    await anyio.sleep(handler_sleep_seconds)

            bus.subscribe(BenchEvent, name=f"bench-{i}", ordered=ordering_keys > 0)(handler)
        await bus.register()  # subscriptions exist before publishing: no backfill
        t0 = time.perf_counter()
        for start in range(0, n, publish_batch):
            await bus.publish_many(
                Envelope(BenchEvent(n=i), ordering_key=f"k{i % ordering_keys}" if ordering_keys else None)
                for i in range(start, min(n, start + publish_batch))
            )
        t1 = time.perf_counter()
        await bus.backend.schema.analyze()
        t_drain = time.perf_counter()
        await Worker(bus, concurrency=concurrency, batch_size=batch_size, burst=True).run()
        t2 = time.perf_counter()
        deliveries = n * subscriptions
        return {
            "backend": bus.backend.kind,
            "n": n,
            "subscriptions": subscriptions,
            "concurrency": concurrency,
            "batch_size": batch_size,
            "handler_sleep_seconds": handler_sleep_seconds,
            "ordering_keys": ordering_keys,
            "publish_per_second": n / (t1 - t0),
            "deliveries_per_second": deliveries / (t2 - t_drain),
        }
    finally:
        await bus.aclose()


@click.command()
@click.option("--n", "n", default=20_000, show_default=True, help="Events to drain.")
@click.option("--concurrency", default=200, show_default=True)
@click.option("--batch-size", default=100, show_default=True)
@click.option("--subscriptions", default=1, show_default=True, help="Fan-out per event.")
@click.option("--handler-sleep", default=0.0, show_default=True, help="Seconds per handler.")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--chart",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a PNG chart of the run here (needs eventbus[bench]).",
)
@click.pass_obj
def bench(
    obj: Obj,
    n: int,
    concurrency: int,
    batch_size: int,
    subscriptions: int,
    handler_sleep: float,
    as_json: bool,
    chart: str | None,
) -> None:
    """Measure end-to-end claim throughput (publish N, then drain)."""
    pyplot = _pyplot() if chart else None

    async def go() -> dict[str, Any]:
        return await drain_throughput(
            obj.dsn,
            n,
            concurrency=concurrency,
            batch_size=batch_size,
            subscriptions=subscriptions,
            handler_sleep_seconds=handler_sleep,
        )

    result = run(go)
    if pyplot is not None and chart:
        _write_chart(pyplot, result, chart)
    if as_json:
        click.echo(msgspec.json.encode(result))
        return
    click.echo(
        f"{result['backend']}: published {result['publish_per_second']:,.0f} events/s; "
        f"drained {result['deliveries_per_second']:,.0f} deliveries/s "
        f"(n={n}, subscriptions={subscriptions}, concurrency={concurrency}, "
        f"batch={batch_size})"
    )


def _pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend, or one clear error naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        raise click.ClickException("--chart needs matplotlib: pip install 'eventbus[bench]'") from None
    return pyplot


def _write_chart(pyplot: Any, result: dict[str, Any], path: str) -> None:
    """A two-bar PNG: publish and drain rates of this run, labelled with its settings."""
    fig, ax = pyplot.subplots(figsize=(7, 3.2), dpi=120)
    rates = [result["publish_per_second"], result["deliveries_per_second"]]
    bars = ax.barh(["publish (batches of 1,000)", "drain (deliveries)"], rates, color=["#6b8fb3", "#3d6b35"])
    ax.bar_label(bars, labels=[f"{r:,.0f}/s" for r in rates], padding=4)
    ax.set_xlim(0, max(rates) * 1.3)
    ax.set_xlabel("per second")
    ax.set_title(
        f"eventbus bench on {result['backend']}: n={result['n']}, "
        f"concurrency={result['concurrency']}, batch={result['batch_size']}",
        fontsize=9,
        loc="left",
    )
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
