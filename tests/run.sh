#!/usr/bin/env bash
# Install eventbus with its dev extras into .venv, then lint, type-check, build the docs and test.
# PostgreSQL: $EVENTBUS_TEST_DSN when set, otherwise a throwaway server is started
# from the local PostgreSQL binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
.venv/bin/ruff check eventbus handlers schemas tests benchmarks
.venv/bin/ruff format --check eventbus handlers schemas tests benchmarks
.venv/bin/mypy eventbus
.venv/bin/mypy schemas handlers tests
.venv/bin/lint-imports
# The guide and API reference: a warning (a broken link or docstring reference) fails the build.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir site
exec .venv/bin/pytest -m "not soak" "$@"
