"""``eventbus bench``: end-to-end claim throughput on the configured database.

Publishes N events beforehand in batches, refreshes the planner statistics
(as autovacuum would in steady state), then drains them with a no-op handler
in burst mode and reports events per second
(:func:`eventbus.testing.drain_throughput`). PostgreSQL runs use a fresh
scratch schema, SQLite runs a temporary file; either is deleted afterwards.
"""

from __future__ import annotations

from typing import Any

import click
import msgspec

from ..testing import Throughput, drain_throughput
from ._common import COUNT, SECONDS, Obj, run

__all__ = ["bench"]


@click.command()
@click.option("--n", "n", default=20_000, show_default=True, type=COUNT, help="Events to drain.")
@click.option("--concurrency", default=200, show_default=True, type=COUNT)
@click.option("--batch-size", default=100, show_default=True, type=COUNT)
@click.option("--subscriptions", default=1, show_default=True, type=COUNT, help="Fan-out per event.")
@click.option("--handler-sleep", default=0.0, show_default=True, type=SECONDS, help="Seconds per handler.")
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

    async def go() -> Throughput:
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
        f"{result.backend}: published {result.publish_per_second:,.0f} events/s; "
        f"drained {result.deliveries_per_second:,.0f} deliveries/s "
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


def _write_chart(pyplot: Any, result: Throughput, path: str) -> None:
    """A two-bar PNG: publish and drain rates of this run, labelled with its settings."""
    fig, ax = pyplot.subplots(figsize=(7, 3.2), dpi=120)
    rates = [result.publish_per_second, result.deliveries_per_second]
    bars = ax.barh(["publish (batches of 1,000)", "drain (deliveries)"], rates, color=["#6b8fb3", "#3d6b35"])
    ax.bar_label(bars, labels=[f"{r:,.0f}/s" for r in rates], padding=4)
    ax.set_xlim(0, max(rates) * 1.3)
    ax.set_xlabel("per second")
    ax.set_title(
        f"eventbus bench on {result.backend}: n={result.n}, "
        f"concurrency={result.concurrency}, batch={result.batch_size}",
        fontsize=9,
        loc="left",
    )
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
