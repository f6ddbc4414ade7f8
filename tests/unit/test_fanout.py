"""The pure parts of fan-out schedules: tenant checks, keys and the spread offsets."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from eventbus import InvalidSchedule
from eventbus.fanout import MAX_TENANTS, check_tenants, spread_offset, tenant_key


def test_tenants_are_distinct_non_empty_strings() -> None:
    assert check_tenants("s", (t for t in ["a", "b"])) == ["a", "b"]
    assert check_tenants("s", []) == []
    for found, message in (
        ("ab", "an iterable of str"),
        (None, "not NoneType"),
        (["a", 1], "returned 1"),
        (["a", ""], "returned ''"),
        (["a\x00"], "without NUL"),
        (["x" * 201], "at most 200"),
        (["a", "b", "a"], "tenants twice: ['a']"),
        (range(MAX_TENANTS + 1), f"over {MAX_TENANTS}"),
    ):
        with pytest.raises(InvalidSchedule, match=message.replace("[", r"\[").replace("]", r"\]")):
            check_tenants("s", found)


def test_each_tenant_keeps_its_own_offset_in_the_window() -> None:
    tenants = [f"customer-{i}" for i in range(2000)]
    offsets = [spread_offset("nightly", t, 3600) for t in tenants]
    assert offsets == [spread_offset("nightly", t, 3600) for t in tenants]  # the same at every occurrence
    assert all(0 <= o < 3600 for o in offsets)
    per_quarter = [sum(q * 900 <= o < (q + 1) * 900 for o in offsets) for q in range(4)]
    assert min(per_quarter) > 400  # spread over the window, not bunched
    assert spread_offset("nightly", "a", 0) == 0.0
    assert spread_offset("weekly", "customer-1", 3600) != offsets[1]  # another schedule, another offset


def test_a_tenant_key_names_the_occurrence_and_the_tenant() -> None:
    when = datetime(2026, 12, 4, 2, 0, tzinfo=UTC)
    assert tenant_key("retrain-all", when, "acme") == "retrain-all@2026-12-04T02:00:00+00:00/acme"
