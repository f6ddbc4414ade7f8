"""Render result JSON files (from --json) as one Markdown table.

python -m benchmarks.peers.report results/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if unit == "ms" else f"{x:,.0f}"


def row(r: dict[str, Any]) -> str:
    unit = r["unit"]
    if unit == "ms":
        value = f"p50 {fmt(r['p50'], unit)} / p99 {fmt(r['p99'], unit)}"
        spread = f"{r['n']} samples"
    else:
        value = fmt(r["median"], unit)
        spread = f"{fmt(r['min'], unit)} - {fmt(r['max'], unit)}"
    return (
        f"| {r['system']} | {r['scenario']} | {r['setting']} | {r['workers']} | {r['n']:,} "
        f"| {value} | {spread} | {unit} |"
    )


def main(paths: list[str]) -> None:
    print("| system | scenario | setting | workers | n | median | range (3 runs) | unit |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        for r in json.loads(Path(path).read_text()):
            if "system" in r:  # other scripts' records have their own shape
                print(row(r))


if __name__ == "__main__":
    main(sys.argv[1:])
