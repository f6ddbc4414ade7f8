"""Every dashboard page at scale on PostgreSQL: its time and the plans of the queries it runs.

    python -m benchmarks.dashboard_pages --dsn postgresql://postgres@127.0.0.1:5432/bench_pages \
        --deliveries 1000000 --out benchmarks/results/dashboard_pages.md [--reuse]

Seeds (set-based SQL, then ``VACUUM ANALYZE``) ``--deliveries`` deliveries
over four subscriptions, one event each: a tenth dead in the older half with
36 causes (error type and message, with varying ids), a few thousand pending
(some failing, with an error), some processing (some past their lease),
some cancelled, the rest completed; chains of correlated events; 100,000
instances of a state machine (three of them run for real up to their
approval), twenty schedules with 50,000 occurrences, 100,000 audit rows. With
``--reuse`` a database seeded before at the same size is kept (the migrations
the code has since gained are applied to it).

Then it asks the application (``create_app(bus).routes``) for its GET routes,
fills their path parameters with ids of the seed, adds filtered variants of
the lists (status and subscription, deep cursors, substring and payload
filters, triage kinds), and requests each through an in-process ASGI client:
the first request (cold) and the median of ``--runs`` more. One more request
of each page runs with a query logger on the bus's connections; each query it
sent is then run again under ``EXPLAIN (ANALYZE, BUFFERS)`` with its
arguments. A page's "rows read" adds the rows each scan node produced or
removed by a filter, times its loops; its worst node is the scan that read
the most. ``--baseline`` takes the JSON of an earlier run (``--json``) and
shows its figures beside these. The database name must start with ``bench_``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from benchmarks.peers.common import recreate_database
from eventbus import Bus, Context, Event, Worker
from eventbus.workflows import Approval, Machine, StepContext

SCHEMA = "eventbus"
MARKER = "public.dashboard_pages_seed"
MACHINE = "bench-flow"
LIVE_KEYS = ("live-1", "live-2", "live-3")
SCHEDULES = 20
OCCURRENCES = 50_000
INSTANCES = 100_000
AUDIT_ROWS = 100_000
CHUNK = 200_000
SCAN_ROWS = 15_000
"""A page whose worst scan node reads more than this is marked: a capped count (10,000) and its page
stay below it; anything above reads past what the page shows (a whole table, a filtered walk)."""


class OrderPlaced(Event, event_type="bench.order_placed"):
    order_id: str
    amount_cents: int = 0


class OrderPaid(Event, event_type="bench.order_paid"):
    order_id: str
    amount_cents: int = 0


class OrderShipped(Event, event_type="bench.order_shipped"):
    order_id: str
    amount_cents: int = 0


class RefundIssued(Event, event_type="bench.refund_issued"):
    order_id: str
    amount_cents: int = 0


class ReportDue(Event, event_type="bench.report_due"):
    pass


SUBSCRIPTIONS = (
    ("billing", OrderPlaced),
    ("shipping", OrderPaid),
    ("email", OrderShipped),
    ("ledger", RefundIssued),
)


class Flow(msgspec.Struct):
    key: str
    amount: int = 1


flow = Machine(MACHINE, checkpoint=Flow, key=lambda c: c.key)


@flow.state(
    initial=True,
    on_success="SHIP",
    on_failure="REFUSED",
    approval=Approval(timeout=timedelta(days=30), on_deny="REFUSED", on_timeout="REFUSED"),
)
async def CHARGE(c: Flow, ctx: StepContext) -> None:
    pass


@flow.state(on_success="DONE", on_failure="REFUSED")
async def SHIP(c: Flow, ctx: StepContext) -> None:
    pass


flow.terminal("DONE")
flow.terminal("REFUSED", failed=True)


def declare(bus: Bus) -> None:
    """The subscriptions, the machine and the schedules the seed's rows belong to."""
    for name, cls in SUBSCRIPTIONS:

        async def handle(event: Event, ctx: Context) -> None:
            pass

        bus.subscribe(cls, name=name)(handle)
    bus.include(flow)
    for i in range(SCHEDULES):
        bus.schedule(f"report-{i:02d}", ReportDue, every=timedelta(hours=1 + i))


# -- the seed ------------------------------------------------------------------

# $1 first number, $2 how many, $3 the total, $4 subscription ids, $5 their event types.
# Event ids follow the numbers (offset by the few rows written through the bus
# before), so a delivery's status comes from its place in the history.
LOAD = f"""
WITH ev AS (
    INSERT INTO {SCHEMA}.events (event_type, key, payload, created_at)
    SELECT ($5::text[])[1 + g % 4], 'o-' || g,
           convert_to('{{"order_id":"o-' || g || '","amount_cents":' || (g % 10000) || '}}', 'UTF8'),
           now() - ($3::int - g) * interval '1 second'
    FROM generate_series($1::int, $1::int + $2::int - 1) g
    RETURNING id, event_type, created_at
), placed AS (
    SELECT ev.id, ev.created_at, s.id AS sub,
           CASE WHEN ev.id <= $3::int / 2 AND ev.id % 5 = 0 THEN 'dead'
                WHEN ev.id > $3::int - 20000 AND ev.id % 4 = 0 THEN 'pending'
                WHEN ev.id > $3::int - 2000 AND ev.id % 4 = 1 THEN 'processing'
                WHEN ev.id % 1000 = 7 THEN 'cancelled'
                ELSE 'completed' END AS status
    FROM ev JOIN unnest($4::int[], $5::text[]) AS s(id, event_type) ON s.event_type = ev.event_type
)
INSERT INTO {SCHEMA}.deliveries (event_id, subscription_id, status, attempts, run_at, lease_until,
                                 lease_token, last_error, updated_at)
SELECT id, sub, status,
       CASE status WHEN 'dead' THEN 5 WHEN 'completed' THEN 1 ELSE 0 END,
       created_at,
       CASE WHEN status = 'processing' THEN now() + CASE WHEN id % 8 = 1 THEN -60 ELSE 30 END
                                                     * interval '1 second' END,
       CASE WHEN status = 'processing' THEN gen_random_uuid() END,
       CASE WHEN status = 'dead' OR (status = 'pending' AND id % 8 = 0)
            THEN (ARRAY['KeyError', 'TimeoutError', 'ValueError', 'ConnectionError', 'RuntimeError',
                        'PermissionError'])[1 + (id / 5) % 6]
                 || ': ' || (ARRAY['order', 'invoice', 'customer', 'shipment', 'refund', 'coupon'])
                     [1 + (id / 30) % 6]
                 || ' ' || id || ' ' || (ARRAY['not found', 'timed out after 30s', 'refused by 10.0.3.1',
                     'declined', 'locked', 'missing'])[1 + (id / 5) % 6]
       END,
       created_at + interval '2 seconds'
FROM placed
"""

CHAINS = f"""
UPDATE {SCHEMA}.events SET correlation_id = id - id % 10, causation_id = id - 1
WHERE id % 10 IN (1, 2) AND id > 10
"""

ATTEMPTS = f"""
INSERT INTO {SCHEMA}.delivery_attempts
    (delivery_id, attempt, error_type, message, traceback, duration_seconds)
SELECT id, 5, split_part(last_error, ':', 1), last_error,
       'Traceback (most recent call last):' || chr(10) || '  File "handlers.py", line 12, in handle'
           || chr(10) || last_error,
       0.012
FROM {SCHEMA}.deliveries WHERE status = 'dead'
"""

INSTANCES_SQL = f"""
INSERT INTO {SCHEMA}.wf_instances (machine, key, state, status, checkpoint, updated_at)
SELECT '{MACHINE}', 'k-' || g,
       CASE WHEN g % 20 = 0 THEN 'CHARGE' WHEN g % 20 = 1 THEN 'REFUSED' ELSE 'DONE' END,
       CASE WHEN g % 20 = 0 THEN 'waiting_approval' WHEN g % 20 = 1 THEN 'failed' ELSE 'completed' END,
       convert_to('{{"key":"k-' || g || '","amount":' || g || '}}', 'UTF8'),
       now() - g * interval '1 minute'
FROM generate_series(1, $1::int) g
"""

OCCURRENCES_SQL = f"""
INSERT INTO {SCHEMA}.schedule_occurrences (schedule, scheduled_for, status, fired_at, finished_at)
SELECT 'report-00', date_trunc('hour', now()) - g * interval '1 hour', 'fired',
       date_trunc('hour', now()) - g * interval '1 hour', date_trunc('hour', now()) - g * interval '1 hour'
FROM generate_series(1, $1::int) g
"""

AUDIT_SQL = f"""
INSERT INTO {SCHEMA}.audit_log (at, actor, origin, action, target, filter, count, interface)
SELECT now() - g * interval '1 minute', (ARRAY['alice', 'bob', 'carol', 'dave'])[1 + g % 4], '127.0.0.1',
       (ARRAY['replay', 'purge', 'cancel', 'pause', 'resume', 'approve'])[1 + g % 6],
       'billing', NULL, g % 100, CASE WHEN g % 3 = 0 THEN 'cli' ELSE 'dashboard' END
FROM generate_series(1, $1::int) g
"""

WORKERS_SQL = f"""
INSERT INTO {SCHEMA}.workers (id, hostname, pid, listener_ok)
SELECT gen_random_uuid(), 'host-' || g, 1000 + g, true FROM generate_series(1, 3) g
"""


async def seeded_size(dsn: str) -> int | None:
    """The size of an earlier seed of this database, if it is there."""
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        return None
    try:
        return (
            await conn.fetchval(f"SELECT deliveries FROM {MARKER}")
            if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", MARKER)
            else None
        )
    finally:
        await conn.close()


async def run_live_instances(bus: Bus) -> None:
    """Start a few runs through the bus and let a worker take them up to their approval."""
    for key in LIVE_KEYS:
        await bus.workflows.start(flow, Flow(key=key))
    worker = Worker(bus, concurrency=4, poll_interval_seconds=0.2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(60):
            while True:
                found = [await bus.workflows.instance(flow, k) for k in LIVE_KEYS]
                if all(i.status == "waiting_approval" for i in found):
                    break
                await anyio.sleep(0.2)
        worker.stop()


async def seed(dsn: str, deliveries: int) -> float:
    await recreate_database(dsn)
    bus = Bus(dsn, schema=SCHEMA)
    declare(bus)
    t0 = time.perf_counter()
    try:
        await bus.migrate()
        ids = await bus.register()
        await run_live_instances(bus)
        await bus.schedules.declare()
        await bus.schedules.trigger("report-01")
        await bus.schedules.tick()
    finally:
        await bus.aclose()
    conn = await asyncpg.connect(dsn)
    try:
        subs = [ids[name] for name, _ in SUBSCRIPTIONS]
        types = [cls.__event_type__ for _, cls in SUBSCRIPTIONS]  # type: ignore[attr-defined]
        for start in range(1, deliveries + 1, CHUNK):
            n = min(CHUNK, deliveries + 1 - start)
            await conn.execute(LOAD, start, n, deliveries, subs, types)
            print(f"seeded {start + n - 1:,} deliveries", flush=True)
        await conn.execute(CHAINS)
        await conn.execute(ATTEMPTS)
        await conn.execute(INSTANCES_SQL, INSTANCES)
        await conn.execute(OCCURRENCES_SQL, OCCURRENCES)
        await conn.execute(AUDIT_SQL, AUDIT_ROWS)
        await conn.execute(WORKERS_SQL)
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
        await conn.execute(f"CREATE TABLE {MARKER} AS SELECT $1::int AS deliveries", deliveries)
    finally:
        await conn.close()
    return time.perf_counter() - t0


async def sample_ids(dsn: str) -> dict[str, Any]:
    """Ids of the seed to fill path parameters and cursors with."""
    conn = await asyncpg.connect(dsn)
    try:
        q = lambda sql: conn.fetchval(sql.format(s=SCHEMA))  # noqa: E731
        return {
            "chained_event": await q("SELECT max(correlation_id) FROM {s}.events"),
            "dead_event": await q(
                "SELECT event_id FROM {s}.deliveries WHERE status = 'dead' ORDER BY id LIMIT 1"
            ),
            "dead_delivery": await q("SELECT max(id) FROM {s}.deliveries WHERE status = 'dead'"),
            "middle_delivery": await q("SELECT max(id) / 2 FROM {s}.deliveries"),
            "last_audit": await q("SELECT max(id) / 2 FROM {s}.audit_log"),
            "approval": await q("SELECT max(id) FROM {s}.wf_approvals"),
            "event_key": await q("SELECT key FROM {s}.events WHERE key IS NOT NULL ORDER BY id DESC LIMIT 1"),
        }
    finally:
        await conn.close()


# -- the pages -------------------------------------------------------------------


def path_values(ids: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A value for each path parameter, by the first segment of the route (``""``: any route)."""
    return {
        "machines": {"name": MACHINE, "key": LIVE_KEYS[0], "run_id": "1"},
        "schedules": {"name": "report-00"},
        "subscriptions": {"name": "billing"},
        "triage": {"delivery_id": str(ids["dead_delivery"])},
        "": {
            "event_id": str(ids["chained_event"]),
            "delivery_id": str(ids["dead_delivery"]),
            "approval_id": str(ids["approval"]),
            "name": "billing",
            "key": LIVE_KEYS[0],
        },
    }


def variants(ids: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Filtered requests of the list pages (a route absent from the application is left out)."""
    mid = str(ids["middle_delivery"])
    return {
        "/deliveries": [
            {"status": "dead", "subscription": "billing"},
            {"status": "dead"},
            {"status": "pending"},
            {"status": "processing"},
            {"status": "completed", "subscription": "shipping"},
            {"subscription": "billing"},
            {"before": mid},
            {"status": "dead", "before": mid},
            {"event_type": "bench.order_paid"},
            {"key": ids["event_key"]},
            {"correlation_id": str(ids["chained_event"])},
            {"since": "2000-01-01T00:00", "status": "cancelled"},
            {"payload_path": "amount_cents", "payload_value": "7"},
        ],
        "/dead": [
            {"subscription": "billing"},
            {"event_type": "bench.order_paid"},
            {"before": mid},
            {"error_contains": "refused"},
        ],
        "/events/{event_id}": [{"event_id": str(ids["dead_event"])}],
        "/triage": [
            {"kind": "failing"},
            {"error_contains": "refused"},
            {"subscription": "billing"},
            {"payload_contains": "o-99"},
        ],
        "/audit": [{"action": "replay"}, {"actor": "alice"}, {"actor": "bob", "action": "cancel"},
                   {"before": str(ids["last_audit"])}],
        "/machines/{name}": [{"status": "waiting_approval"}, {"state": "CHARGE"}],
        "/live": [],
    }  # fmt: skip


FIXED_QUERY = {"/live": {"max_seconds": "0.2"}}
"""Query strings a route needs to answer at all: the live stream takes one look, then ends
within 0.2 s (so its time includes that wait)."""


def get_routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """(full path, its parameters) of every GET route, inside mounted routers too (not static files)."""
    for route in routes:
        if isinstance(route, Route) and "GET" in (route.methods or ()):
            yield prefix + route.path, list(route.param_convertors)
        elif isinstance(route, Mount) and not isinstance(route.app, StaticFiles):
            yield from get_routes(list(route.routes), prefix + route.path)


def fill(path: str, values: dict[str, str]) -> str:
    """``path`` with each ``{name}`` or ``{name:convertor}`` replaced by its value, quoted."""
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: urllib.parse.quote(values[m.group(1)], safe="/"), path)


def requests_of(app_routes: list[Any], ids: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(route, URL, why skipped) for every GET route of the application and the variants of each."""
    values = path_values(ids)
    extra = variants(ids)
    out: list[tuple[str, str, str | None]] = []
    for path, params in get_routes(app_routes):
        first = path.strip("/").split("/")[0]
        given = {**values[""], **values.get(first, {})}
        missing = [p for p in params if p not in given]
        if missing:
            out.append((path, path, f"no value for {', '.join(missing)}"))
            continue
        for query in [{}, *extra.get(path, [])]:
            rest = {**FIXED_QUERY.get(path, {}), **{k: v for k, v in query.items() if k not in params}}
            url = fill(path, {**given, **{k: v for k, v in query.items() if k in params}})
            out.append((path, url + ("?" + urllib.parse.urlencode(rest) if rest else ""), None))
    return out


class Recorder:
    """The queries the bus sends on its pooled connections while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.queries: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, record: Any) -> None:
        if self.on:
            self.queries.append((record.query, tuple(record.args or ())))

    def attach(self, bus: Bus) -> None:
        db = bus.backend.db  # type: ignore[attr-defined]
        plain = db.pool_conn

        @contextlib.asynccontextmanager
        async def logged(operation: str = "a query") -> AsyncIterator[Any]:
            async with plain(operation) as conn:
                conn.add_query_logger(self)
                try:
                    yield conn
                finally:
                    conn.remove_query_logger(self)

        db.pool_conn = logged

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
        self.queries = []
        self.on = True
        try:
            yield self.queries
        finally:
            self.on = False


def _bare(sql: str) -> str:
    return "\n".join(line for line in sql.strip().splitlines() if not line.lstrip().startswith("--")).strip()


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def summary(plan: dict[str, Any]) -> dict[str, Any]:
    """Rows the scans read (produced or filtered out, times loops), the worst scan, buffers, time."""
    rows, worst, seq = 0, (0, ""), False
    for node in _walk(plan["Plan"]):
        if "Relation Name" not in node:
            continue
        loops = node.get("Actual Loops", 1)
        read = loops * (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                        + node.get("Rows Removed by Index Recheck", 0))  # fmt: skip
        rows += read
        where = node["Relation Name"] + (f" using {node['Index Name']}" if "Index Name" in node else "")
        seq = seq or node["Node Type"] == "Seq Scan"
        if read >= worst[0]:
            worst = (read, f"{node['Node Type']} on {where}: {read:,}")
    top = plan["Plan"]
    blocks = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return {"rows": rows, "worst": worst[1], "worst_rows": worst[0], "seq": seq, "blocks": blocks,
            "ms": plan.get("Execution Time", 0.0)}  # fmt: skip


async def explain(dsn: str, sql: str, args: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            text = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
            raw = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args)
            # A write the page made would be undone here (a GET page makes none).
            raise _Undo
    except _Undo:
        pass
    finally:
        await conn.close()
    return "\n".join(r[0] for r in text), summary(json.loads(raw)[0])


class _Undo(Exception):
    pass


async def measure(args: argparse.Namespace, ids: dict[str, Any]) -> list[dict[str, Any]]:
    from eventbus.web import create_app

    bus = Bus(args.dsn, schema=SCHEMA)
    declare(bus)
    await bus.migrate()
    recorder = Recorder()
    recorder.attach(bus)
    names = {_bare(sql): name for name, sql in bus.backend.db.q.items()}  # type: ignore[attr-defined]
    app = create_app(bus, page_size=50)
    results = []
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as web:
            for route, url, skipped in requests_of(list(app.routes), ids):
                if skipped:
                    results.append({"route": route, "url": url, "skipped": skipped})
                    print(f"{url}: skipped ({skipped})", flush=True)
                    continue
                t0 = time.perf_counter()
                first = await web.get(url)
                cold = (time.perf_counter() - t0) * 1000
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    await web.get(url)
                    times.append((time.perf_counter() - t0) * 1000)
                with recorder.recording() as sent:
                    await web.get(url)
                queries = []
                for sql, qargs in {repr(q): q for q in sent}.values():
                    if not re.match(r"(SELECT|WITH)\b", _bare(sql), re.IGNORECASE):
                        continue
                    plan, figures = await explain(args.dsn, sql, qargs)
                    name = names.get(_bare(sql), _bare(sql).splitlines()[0][:60])
                    queries.append(
                        {"name": name, "args": [repr(a)[:60] for a in qargs], "plan": plan, **figures}
                    )
                result = {
                    "route": route, "url": url, "status": first.status_code,
                    "cold_ms": round(cold, 1), "median_ms": round(statistics.median(times), 1),
                    "queries": queries,
                    "rows": sum(q["rows"] for q in queries),
                    "worst": max(queries, key=lambda q: q["worst_rows"])["worst"] if queries else "",
                    "scan": any(q["worst_rows"] > SCAN_ROWS for q in queries),
                }  # fmt: skip
                results.append(result)
                print(f"{url}: {result['status']} median {result['median_ms']} ms, "
                      f"cold {result['cold_ms']} ms, {result['rows']:,} rows read; {result['worst']}",
                      flush=True)  # fmt: skip
    finally:
        await bus.aclose()
    return results


# -- the report -------------------------------------------------------------------


def report(results: list[dict[str, Any]], args: argparse.Namespace, load_s: float | None) -> str:
    before = {}
    if args.baseline:
        before = {r["url"]: r for r in json.loads(args.baseline.read_text())["pages"] if "skipped" not in r}
    lines = [
        "# Dashboard pages at scale (PostgreSQL)",
        "",
        f"`{' '.join(args.argv)}`",
        "",
        f"{args.deliveries:,} deliveries (a tenth dead, 36 causes), {INSTANCES:,} machine instances, "
        f"{OCCURRENCES:,} schedule occurrences, {AUDIT_ROWS:,} audit rows; page size 50, counts capped at "
        f"10,000. Median of {args.runs} requests after the first (cold), on a 2-core machine shared with "
        "other work: the times vary from run to run by a factor of two, the rows read do not. Rows read: "
        "rows every scan node of the page's queries produced or filtered out (times loops), from "
        f"`EXPLAIN (ANALYZE, BUFFERS)`; **scan**: the worst node of the page reads more than {SCAN_ROWS:,}.",
        "",
    ]
    if load_s is not None:
        lines += [f"Seeded in {load_s:.0f} s.", ""]
    head = "| page | status | median ms | cold ms | queries | rows read | worst node |"
    rule = "|---|---|---|---|---|---|---|"
    if before:
        head = head.replace("| median ms |", "| median ms (before) |").replace(
            "| rows read |", "| rows read (before) |"
        )
    lines += [head, rule]
    for r in results:
        if "skipped" in r:
            lines.append(f"| `{r['url']}` | skipped: {r['skipped']} | | | | | |")
            continue
        b = before.get(r["url"])
        median = f"{r['median_ms']}" + (f" ({b['median_ms']})" if b else "")
        rows = f"{r['rows']:,}" + (f" ({b['rows']:,})" if b else "")
        mark = " **scan**" if r["scan"] else ""
        lines.append(
            f"| `{r['url']}` | {r['status']} | {median} | {r['cold_ms']} | {len(r['queries'])} "
            f"| {rows}{mark} | {r['worst']} |"
        )
    lines += ["", "## Plans", ""]
    for r in results:
        if "skipped" in r:
            continue
        lines += [f"### `{r['url']}`", ""]
        for q in r["queries"]:
            lines += [f"`{q['name']}` ({', '.join(q['args'])})", "", "```", q["plan"], "```", ""]
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> None:
    load_s = None
    if not args.reuse or await seeded_size(args.dsn) != args.deliveries:
        load_s = await seed(args.dsn, args.deliveries)
        print(f"seeded in {load_s:.0f} s", flush=True)
    ids = await sample_ids(args.dsn)
    results = await measure(args, ids)
    args.out.write_text(report(results, args, load_s))
    if args.json:
        figures = [{k: v for k, v in r.items() if k != "queries"} for r in results]  # the plans are in --out
        text = json.dumps({"deliveries": args.deliveries, "pages": figures}, indent=1)
        args.json.write_text(text + "\n")


def cli() -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/bench_pages")
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="keep an earlier seed of the same size")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dashboard_pages.md"))
    parser.add_argument("--json", type=Path, help="the figures and plans, for a later --baseline")
    parser.add_argument("--baseline", type=Path, help="the --json of an earlier run, shown beside")
    args = parser.parse_args()
    args.argv = ["python -m benchmarks.dashboard_pages", *sys.argv[1:]]
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
