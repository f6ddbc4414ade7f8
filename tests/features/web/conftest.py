"""Dashboard fixtures: a seeded bus on each backend, an in-process HTTP client of its app, a browser.

A test that only reads (or whose every action must be refused) looks at one seeded
bus per backend that the module's tests share (``shared_bus``, ``shared_ro``,
``shared_rw``), on the module's event loop: seeding a fresh store per test was most
of the dashboard tests' time. Each such test checks on its way out that the seeded
data is as it found it (:func:`_fingerprint`), so a test that writes to the shared
store fails there instead of changing what the next one sees.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page

from eventbus import Bus
from eventbus.web import create_app

from ...conftest import Target, open_target, seed_target
from ...support.processes import ProcessGroup
from . import _browser
from ._data import declare, pay, seed

TOKEN = "s3cret-token"
ORIGIN = "http://localhost"
OPERATOR = "alice"


@pytest.fixture(scope="module")
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Module-scoped here, so that a module's tests share one seeded bus per backend (``seeded_once``)."""
    return str(request.param)


@pytest.fixture
async def seeded(bus: Bus) -> Bus:
    await seed(bus)
    return bus


SHARED_LOOP: Final = "module"


@pytest_asyncio.fixture(scope="module", loop_scope=SHARED_LOOP)
async def seeded_once(
    backend_kind: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Bus]:
    """A bus seeded as ``seeded`` is, once per module and backend; tests take it through ``shared_bus``."""
    async with open_target(backend_kind, tmp_path_factory.mktemp("seeded"), request) as target:
        await seed_target(target, request)
        bus = target.bus()
        try:
            await bus.migrate()
            await seed(bus)
            yield bus
        finally:
            await bus.aclose()


async def _fingerprint(bus: Bus) -> tuple[Any, ...]:
    """What a test may not change in the shared seed: events, deliveries, subscriptions,
    the schedule, the machine's instance and approval, the workers."""
    status = await bus.status()
    deliveries = [(d.id, d.status, d.attempts) for d in await bus.find_deliveries(limit=1000)]
    subscriptions = sorted((s.name, s.state) for s in await bus.list_subscriptions())
    instance = await bus.workflows.instance(pay, "c-1")
    approvals = [(a.id, a.status) for a in await bus.workflows.approvals(pay, "c-1")]
    workers = sorted(str(w.id) for w in await bus.workers())
    return (
        status.events,
        deliveries,
        subscriptions,
        await bus.schedules.info("hourly-report"),
        (instance.state, instance.status),
        approvals,
        workers,
    )


@pytest_asyncio.fixture(loop_scope=SHARED_LOOP)
async def shared_bus(seeded_once: Bus) -> AsyncIterator[Bus]:
    """The module's seeded bus, for a test that leaves its data as it found it (checked afterwards)."""
    before = await _fingerprint(seeded_once)
    yield seeded_once
    after = await _fingerprint(seeded_once)
    assert after == before, "a test on the shared seeded bus changed it: give it ``seeded`` instead"


def client_of(bus: Bus, token: str | None) -> httpx.AsyncClient:
    app = create_app(bus, token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


@pytest.fixture
async def ro(seeded: Bus) -> AsyncIterator[httpx.AsyncClient]:
    """Read-only: no token configured."""
    async with client_of(seeded, None) as client:
        yield client


@pytest.fixture
async def rw(seeded: Bus) -> AsyncIterator[httpx.AsyncClient]:
    """Actions allowed with the token."""
    async with client_of(seeded, TOKEN) as client:
        yield client


@pytest_asyncio.fixture(loop_scope=SHARED_LOOP)
async def shared_ro(shared_bus: Bus) -> AsyncIterator[httpx.AsyncClient]:
    """``ro`` on the shared seeded bus."""
    async with client_of(shared_bus, None) as client:
        yield client


@pytest_asyncio.fixture(loop_scope=SHARED_LOOP)
async def shared_rw(shared_bus: Bus) -> AsyncIterator[httpx.AsyncClient]:
    """``rw`` on the shared seeded bus: what it does must change no data (refused, or a preview)."""
    async with client_of(shared_bus, TOKEN) as client:
        yield client


async def unlock(client: httpx.AsyncClient, operator: str = OPERATOR) -> str:
    """Unlock ``client`` as a browser does (the token and a name); return the value its forms carry."""
    r = await client.post("/unlock", data={"token": TOKEN, "operator": operator}, headers={"Origin": ORIGIN})
    assert r.status_code == 303, r.text
    page = await client.get("/dead")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


# --- The browser tests (test_browser.py and the other *_browser.py files) ---
#
# One Chromium per test process: a test that asks for it (``browser``, ``page``…) runs on the
# process's own event loop (pytest-asyncio's session loop), where that Chromium
# lives, and so do the async fixtures it uses (its bus, its target).

BROWSER_LOOP: Final = "session"


def _drives_a_browser(item: pytest.Item) -> bool:
    return "chromium" in getattr(item, "fixturenames", ())  # ``browser``, ``page``… ask for it


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _drives_a_browser(item):
            item.add_marker(pytest.mark.asyncio(loop_scope=BROWSER_LOOP), append=False)
        elif "seeded_once" in getattr(item, "fixturenames", ()):  # on the shared bus's loop
            item.add_marker(pytest.mark.asyncio(loop_scope=SHARED_LOOP), append=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    """Set up a browser test's async function fixtures on its loop (pytest-asyncio reads ``_loop_scope``)."""
    func = fixturedef.func
    moved = (
        fixturedef.scope == "function"
        and _drives_a_browser(request.node)
        and (inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func))
        and getattr(func, "_loop_scope", None) is None
    )
    if moved:
        setattr(func, "_loop_scope", BROWSER_LOOP)  # noqa: B010
    try:
        return (yield)
    finally:
        if moved:
            delattr(func, "_loop_scope")


@pytest_asyncio.fixture(scope=BROWSER_LOOP, loop_scope=BROWSER_LOOP)
async def chromium() -> AsyncIterator[Browser]:
    """This test process's Chromium."""
    async with _browser.chromium() as b:
        yield b


@pytest.fixture
async def browser(chromium: Browser, serve) -> AsyncIterator[Browser]:
    """The process's Chromium; what the test opens in it (``new_page``, ``new_context``) is closed at its end.

    Closed before the dashboards stop (``serve``), so their open event streams end first.
    """
    before = set(chromium.contexts)
    yield chromium
    for context in chromium.contexts:
        if context not in before:
            await context.close()


@pytest.fixture
async def context(browser: Browser) -> BrowserContext:
    """A fresh context (its own cookies and storage) of a desktop-sized window."""
    return await browser.new_context(viewport={"width": 1280, "height": 800})


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    return await context.new_page()


@pytest.fixture
async def serve(target: Target, seeded: Bus, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """``await serve(token)``: the URL of a dashboard of the seeded database, served from this process.

    With ``eventbus dashboard`` options, or ``command=True``, the real command serves it instead.
    """
    async with contextlib.AsyncExitStack() as stack:
        group = ProcessGroup(tmp_path)
        stack.push_async_callback(group.aclose)

        async def start(token: str | None, *options: str, command: bool = False) -> str:
            if options or command:
                return await _browser.serve_command(group, target.env(), token, *options)
            own = target.bus()  # a bus of its own, as the command's (tests/apps/web_app.py)
            declare(own)
            return await stack.enter_async_context(_browser.serve_app(own, token))

        yield start
