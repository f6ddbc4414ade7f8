"""The README's first command: the example application end to end on a fresh SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..support.processes import ROOT


def test_example_runs_end_to_end_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS_")}
    env["EVENTBUS_DSN"] = f"sqlite:///{tmp_path / 'example.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "handlers"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "published 3 new orders" in result.stdout
    assert "dead-letter delivery" in result.stdout and "CardDeclined" in result.stdout
