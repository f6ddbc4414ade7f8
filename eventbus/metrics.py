"""Prometheus metrics (``pip install 'eventbus[metrics]'``).

Names are prefixed ``eventbus_``, in seconds, counters end in ``_total``, and
the only labels are ``subscription``, ``event_type``, ``outcome`` and
``backend`` (never an id)::

    from eventbus.metrics import Metrics, QueueCollector
    metrics = Metrics.install(bus)                  # counters and histograms of this process
    collector = QueueCollector(bus, registry=metrics.registry)  # queue gauges: run ONE per deployment
    # serve metrics.registry yourself (prometheus_client.make_asgi_app(registry)),
    # or metrics.serve(9464) on 127.0.0.1; run `await collector.run()` in a task.

The per-process metrics come from hooks; the queue gauges (backlog, lag,
dead, in flight, and on PostgreSQL table sizes, dead tuples and the xmin
horizon age) are read from the database by :class:`QueueCollector`, which
one process should run, not every worker.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .backends.base import ClaimedDelivery, Completion, OutgoingEvent, Rescue
from .errors import BackendError, ExtraNotInstalled
from .observe import DeliveryOutcome, NoHooks, Publishing
from .types import PublishResult, StatusDetails

if TYPE_CHECKING:
    from .bus import Bus

__all__ = ["Metrics", "QueueCollector", "require_prometheus"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_BATCH = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def require_prometheus() -> Any:
    """The ``prometheus_client`` module, or :class:`ExtraNotInstalled` naming the extra."""
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise ExtraNotInstalled("metrics need prometheus-client: pip install 'eventbus[metrics]'") from exc


class Metrics(NoHooks):
    """The counters and histograms of one process, fed by the bus's hooks."""

    def __init__(self, backend: str, registry: Any = None) -> None:
        prom = require_prometheus()
        self.prom = prom
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.backend = backend
        r, b = self.registry, ["backend"]
        self.published = prom.Counter(
            "eventbus_events_published_total", "Events appended to the log", [*b, "event_type"], registry=r
        )
        self.deduplicated = prom.Counter(
            "eventbus_events_deduplicated_total",
            "Publishes whose key was taken",
            [*b, "event_type"],
            registry=r,
        )
        self.publish_seconds = prom.Histogram(
            "eventbus_publish_duration_seconds", "Publish round trips", b, buckets=_LATENCY, registry=r
        )
        self.claimed = prom.Counter(
            "eventbus_deliveries_claimed_total", "Deliveries claimed", [*b, "subscription"], registry=r
        )
        self.claims_empty = prom.Counter(
            "eventbus_claims_empty_total", "Claims that found nothing", [*b, "subscription"], registry=r
        )
        self.claim_seconds = prom.Histogram(
            "eventbus_claim_duration_seconds",
            "Claim round trips",
            [*b, "subscription"],
            buckets=_LATENCY,
            registry=r,
        )
        self.batch_size = prom.Histogram(
            "eventbus_claim_batch_size",
            "Deliveries per claim",
            [*b, "subscription"],
            buckets=_BATCH,
            registry=r,
        )
        self.finished = prom.Counter(
            "eventbus_deliveries_finished_total",
            "Attempts ended, by outcome",
            [*b, "subscription", "event_type", "outcome"],
            registry=r,
        )
        self.rescued = prom.Counter(
            "eventbus_deliveries_rescued_total",
            "Processing deliveries this process's worker took back from lost workers",
            [*b, "reason"],
            registry=r,
        )
        self.duration = prom.Histogram(
            "eventbus_delivery_duration_seconds",
            "Handler time",
            [*b, "subscription", "outcome"],
            buckets=_LATENCY,
            registry=r,
        )
        self.wait = prom.Histogram(
            "eventbus_delivery_wait_seconds",
            "From runnable to claimed",
            [*b, "subscription"],
            buckets=_LATENCY,
            registry=r,
        )
        self.in_flight = prom.Gauge(
            "eventbus_deliveries_in_flight",
            "Claimed, result not yet written",
            [*b, "subscription"],
            registry=r,
        )

    @classmethod
    def install(cls, bus: Bus, registry: Any = None) -> Metrics:
        """Create the metrics and add them to ``bus``'s hooks (with the listener gauges)."""
        metrics = cls(bus.backend.kind, registry)
        bus.add_hooks(metrics)
        metrics.watch_listener(bus)
        return metrics

    def watch_listener(self, bus: Bus) -> None:
        """Gauges of the wake-up connection: ``backend.wakeups.healthy`` and ``.reconnects``, where kept."""
        wakeups = bus.backend.wakeups
        up = self.prom.Gauge(
            "eventbus_listener_up", "1 while wake-ups are received", ["backend"], registry=self.registry
        )
        reconnects = self.prom.Gauge(
            "eventbus_listener_reconnects_total",
            "Wake-up connection losses",
            ["backend"],
            registry=self.registry,
        )
        up.labels(self.backend).set_function(lambda: float(getattr(wakeups, "healthy", False)))
        reconnects.labels(self.backend).set_function(lambda: float(getattr(wakeups, "reconnects", 0)))

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` of this registry on ``host:port`` from a daemon thread."""
        self.prom.start_http_server(port, addr=host, registry=self.registry)

    def on_publish(self, events: Sequence[OutgoingEvent]) -> Publishing:
        timer = anyio.current_time() if events else 0.0

        def done(results: Sequence[PublishResult] | None, error: BaseException | None) -> None:
            self.publish_seconds.labels(self.backend).observe(anyio.current_time() - timer)
            for event, result in zip(events, results or (), strict=False):
                counter = self.deduplicated if result.duplicate else self.published
                counter.labels(self.backend, event.event_type).inc()

        return events, done

    def on_claim(self, subscription: str, batch: Sequence[ClaimedDelivery], seconds: float) -> None:
        labels = (self.backend, subscription)
        self.claim_seconds.labels(*labels).observe(seconds)
        if not batch:
            self.claims_empty.labels(*labels).inc()
            return
        self.batch_size.labels(*labels).observe(len(batch))
        self.claimed.labels(*labels).inc(len(batch))
        self.in_flight.labels(*labels).inc(len(batch))

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        sub = outcome.subscription
        self.in_flight.labels(self.backend, sub).dec()
        self.finished.labels(self.backend, sub, outcome.delivery.event_type, outcome.kind).inc()
        if outcome.duration_seconds is not None:
            self.duration.labels(self.backend, sub, outcome.kind).observe(outcome.duration_seconds)
        if outcome.wait_seconds is not None:
            self.wait.labels(self.backend, sub).observe(outcome.wait_seconds)
        if outcome.kind == "completed" and isinstance(outcome.result, Completion):
            # Follow-ups are published by the completion's commit, not through Bus.publish.
            for event in outcome.result.follow_ups:
                self.published.labels(self.backend, event.event_type).inc()

    def on_rescue(self, rescues: Sequence[Rescue]) -> None:
        for r in rescues:
            self.rescued.labels(self.backend, r.reason).inc(r.deliveries)


class QueueCollector:
    """Queue and storage gauges read from the database every ``interval`` seconds.

    Registered with ``registry``; :meth:`run` refreshes the snapshot (a scrape
    only reads it, so scrapes never touch the database).
    """

    def __init__(self, bus: Bus, registry: Any = None, interval: float = 15.0) -> None:
        prom = require_prometheus()
        self.bus = bus
        self.interval = interval
        self.snapshot: StatusDetails | None = None
        self.families = importlib.import_module("prometheus_client.core")
        (registry if registry is not None else prom.REGISTRY).register(self)

    async def refresh(self) -> None:
        """Read the queue and storage figures once; :meth:`collect` reports the last read."""
        self.snapshot = await self.bus.backend.inspect.health()

    async def run(self) -> None:
        """Refresh until cancelled; a failed read keeps the last snapshot."""
        while True:
            try:
                await self.refresh()
            except BackendError:
                pass
            await anyio.sleep(self.interval)

    def collect(self) -> Iterator[Any]:
        """The gauges of the last :meth:`refresh`, for the Prometheus registry."""
        snap, f, kind = self.snapshot, self.families, self.bus.backend.kind
        if snap is None:
            return
        gauges = {
            "backlog": f.GaugeMetricFamily(
                "eventbus_subscription_backlog",
                "Runnable pending deliveries",
                labels=["backend", "subscription"],
            ),
            "lag": f.GaugeMetricFamily(
                "eventbus_subscription_lag_seconds",
                "Age of the oldest runnable pending delivery",
                labels=["backend", "subscription"],
            ),
            "processing": f.GaugeMetricFamily(
                "eventbus_subscription_processing",
                "Deliveries under a lease",
                labels=["backend", "subscription"],
            ),
            "stuck": f.GaugeMetricFamily(
                "eventbus_subscription_stuck",
                "Deliveries processing past their lease",
                labels=["backend", "subscription"],
            ),
            "dead": f.GaugeMetricFamily(
                "eventbus_dead_letters", "Dead deliveries", labels=["backend", "subscription"]
            ),
        }
        for s in snap.queues:
            labels = [kind, s.name]
            gauges["backlog"].add_metric(labels, s.backlog)
            gauges["lag"].add_metric(labels, s.lag_seconds or 0.0)
            gauges["processing"].add_metric(labels, s.in_flight)
            gauges["stuck"].add_metric(labels, s.stuck)
            gauges["dead"].add_metric(labels, s.dead)
        yield from gauges.values()
        yield from self._storage(snap)

    def _storage(self, snap: StatusDetails) -> Iterator[Any]:
        if not snap.tables:
            return
        f = self.families
        dead = f.GaugeMetricFamily(
            "eventbus_table_dead_tuples", "Dead tuples of a bus table", labels=["table"]
        )
        size = f.GaugeMetricFamily(
            "eventbus_table_bytes", "Size of a bus table with its indexes", labels=["table"]
        )
        for t in snap.tables:
            dead.add_metric([t.table], t.dead_tuples)
            size.add_metric([t.table], t.total_bytes)
        horizon = f.GaugeMetricFamily(
            "eventbus_xmin_horizon_age_seconds", "Age of the oldest transaction holding back VACUUM"
        )
        horizon.add_metric([], snap.horizon.age_seconds if snap.horizon else 0.0)
        yield from (dead, size, horizon)
