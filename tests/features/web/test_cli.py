"""``eventbus dashboard``: one clear line when the extra is missing or the database is not ready."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCK_WEB_EXTRA = """
import importlib.util, sys
_find = importlib.util.find_spec
_web = ('starlette', 'jinja2', 'uvicorn')
importlib.util.find_spec = lambda n, *a: None if n.split('.')[0] in _web else _find(n, *a)
from eventbus.cli import main
sys.argv = ['eventbus'] + sys.argv[1:]
main()
"""


def _run(args: list[str], tmp_path: Path, code: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = (
        [sys.executable, "-c", code, *args]
        if code
        else [str(Path(sys.executable).with_name("eventbus")), *args]
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_missing_extra_is_one_line(tmp_path: Path) -> None:
    r = _run(["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "dashboard"], tmp_path, BLOCK_WEB_EXTRA)
    assert r.returncode != 0
    assert r.stderr.strip() == "Error: the dashboard needs the web extra: pip install 'eventbus[web]'"


def test_an_unmigrated_database_is_refused_before_serving(tmp_path: Path) -> None:
    r = _run(["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "dashboard", "--port", "1"], tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SchemaNotMigrated" in lines[0] and "Traceback" not in r.stderr
