"""The rollup's duration buckets and percentiles: fixed, log-spaced, mergeable by adding counts."""

from __future__ import annotations

import random

import pytest

from eventbus import ConfigurationError
from eventbus.throughput import LAST_BUCKET, bucket_of, bucket_seconds, percentile, window_of


def test_a_bucket_stands_for_its_runs_within_ten_percent() -> None:
    for seconds in [0.00011, 0.0004, 0.003, 0.0271, 0.5, 1.0, 7.3, 120.0, 3600.0]:
        assert abs(bucket_seconds(bucket_of(seconds)) / seconds - 1) < 0.095, seconds
    assert bucket_of(0.0) == bucket_of(0.0001) == 0 and bucket_of(10**9) == LAST_BUCKET
    edges = [bucket_of(0.0001 * 1.01**i) for i in range(2000)]
    assert edges == sorted(edges)  # longer never falls in an earlier bucket


def test_percentiles_of_merged_histograms_match_the_runs() -> None:
    rnd = random.Random(3)
    runs = [rnd.lognormvariate(-4, 1.2) for _ in range(20_000)]
    halves: list[dict[int, int]] = [{}, {}]  # two workers' histograms, merged by adding counts
    for i, seconds in enumerate(runs):
        h = halves[i % 2]
        h[bucket_of(seconds)] = h.get(bucket_of(seconds), 0) + 1
    merged = {b: halves[0].get(b, 0) + halves[1].get(b, 0) for b in {*halves[0], *halves[1]}}
    runs.sort()
    for q in (0.5, 0.95, 0.99):
        exact = runs[int(q * len(runs)) - 1]
        estimate = percentile(merged, q)
        assert estimate is not None and abs(estimate / exact - 1) < 0.12, (q, estimate, exact)
    assert percentile({}, 0.5) is None


def test_only_the_two_windows_are_known() -> None:
    assert window_of("1h") == (3600, 60) and window_of("1d") == (86400, 600)
    with pytest.raises(ConfigurationError, match="window must be one of 1h, 1d, got '7d'"):
        window_of("7d")
