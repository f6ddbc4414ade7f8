"""Dashboard fixtures: a seeded bus on each backend and an in-process HTTP client of its app."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from eventbus import Bus
from eventbus.web import create_app

from ._data import seed

TOKEN = "s3cret-token"
ORIGIN = "http://localhost"
OPERATOR = "alice"


@pytest.fixture
async def seeded(bus: Bus) -> Bus:
    await seed(bus)
    return bus


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


async def unlock(client: httpx.AsyncClient, operator: str = OPERATOR) -> str:
    """Unlock ``client`` as a browser does (the token and a name); return the value its forms carry."""
    r = await client.post("/unlock", data={"token": TOKEN, "operator": operator}, headers={"Origin": ORIGIN})
    assert r.status_code == 303, r.text
    page = await client.get("/dead")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)
