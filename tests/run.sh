#!/usr/bin/env bash
# Install eventbus with its dev extras into .venv, then lint, type-check, build the docs and test.
# PostgreSQL: $EVENTBUS_TEST_DSN when set, otherwise a throwaway server is started
# from the local PostgreSQL binaries. The tests run on $EVENTBUS_TEST_WORKERS
# pytest-xdist workers (default 4; 0 runs them in this process), each with a
# database of its own; the lint and type checks run alongside them and their
# output follows the tests'. Arguments go to pytest (`bash tests/run.sh -n 0 -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
# The tests start hundreds of eventbus processes: give them bytecode to read
# even where PYTHONDONTWRITEBYTECODE keeps them from writing it.
.venv/bin/python -m compileall -q eventbus tests

checks() {
    .venv/bin/ruff check eventbus handlers schemas tests benchmarks docs/_ext
    .venv/bin/ruff format --check eventbus handlers schemas tests benchmarks docs/_ext
    .venv/bin/mypy eventbus
    .venv/bin/mypy schemas handlers tests docs/_ext
    .venv/bin/lint-imports
    # The guide and API reference: a warning (a broken link or docstring reference) fails the build.
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir site
}
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
(set -e; checks) >"$log" 2>&1 &
checks_pid=$!

status=0
.venv/bin/pytest -m "not soak" -n "${EVENTBUS_TEST_WORKERS:-4}" "$@" || status=$?
checks_status=0
wait "$checks_pid" || checks_status=$?
echo "--- lint, format, type and import checks ---"
cat "$log"
[ "$checks_status" -eq 0 ] || echo "the checks failed (exit $checks_status)"
[ "$status" -ne 0 ] && exit "$status"
exit "$checks_status"
