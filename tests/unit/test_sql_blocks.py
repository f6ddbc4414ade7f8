"""Named SQL blocks: fragments are included where they are named, never run on their own."""

from __future__ import annotations

import pytest

from eventbus import ConfigurationError
from eventbus.backends._sql import assemble, load_queries


def test_a_fragment_is_included_where_named_and_is_no_query() -> None:
    blocks = {
        "_only_live": "-- what it keeps\nstatus <> 'dead'",
        "live": "SELECT id FROM {schema}.deliveries WHERE {_only_live} AND id > $1",
    }
    assert assemble(blocks, "bus", "test") == {
        "live": "SELECT id FROM \"bus\".deliveries WHERE status <> 'dead' AND id > $1"
    }


def test_a_fragment_nobody_defined_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="_missing"):
        assemble({"q": "SELECT 1 WHERE {_missing}"}, "bus", "test")


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_every_backend_query_has_its_fragments_filled_in(backend: str) -> None:
    queries = load_queries(backend, "main")
    assert not [name for name in queries if name.startswith("_")]
    assert not [name for name, sql in queries.items() if "{_" in sql]
    for name in ("find_deliveries", "count_deliveries", "delivery_ids", "delivery_ids_dead"):
        assert "e.event_type" in queries[name], name
