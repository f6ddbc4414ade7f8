"""Draw the side-by-side drain chart from result JSON files.

    python -m benchmarks.chart benchmarks/results/*.json --out benchmarks/results/drain.png

Needs matplotlib (the ``bench`` extra). One bar per system: its best median
end-to-end drain rate (no-op handler and 1 ms handler), with the bare
SKIP LOCKED loop as a reference line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def best(records: list[dict[str, Any]], scenario: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in records:
        if r["scenario"] == scenario:
            out[r["system"]] = max(out.get(r["system"], 0.0), float(r["median"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", default="benchmarks/results/drain.png")
    args = parser.parse_args()
    records = [r for p in args.paths for r in json.loads(Path(p).read_text())]
    noop, one_ms = best(records, "drain_noop"), best(records, "drain_1ms")
    limit = max(
        (float(r["median"]) for r in records if r["scenario"] == "bare_skip_locked" and r["workers"] == 1),
        default=None,
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = sorted(noop, key=lambda s: -noop[s])
    xs = range(len(systems))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([x - 0.2 for x in xs], [noop[s] for s in systems], 0.4, label="no-op handler")
    ax.bar([x + 0.2 for x in xs], [one_ms.get(s, 0) for s in systems], 0.4, label="1 ms handler")
    if limit:
        ax.axhline(
            limit, linestyle="--", color="grey", label=f"bare SKIP LOCKED loop, 1 connection ({limit:,.0f}/s)"
        )
    ax.set_xticks(list(xs), systems)
    ax.set_ylabel("events/s (median of 3, best setting)")
    ax.set_title("End-to-end drain of 20,000 events, one worker process, 2 cores, PostgreSQL 15")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
