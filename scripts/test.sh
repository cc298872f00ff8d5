#!/usr/bin/env bash
# The project's one test command: sets everything up, then lint, types, and every test (unit
# and integration, against a real Kafka broker and a real Spark session started by the tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh --with-browser
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# pytest exits 5 when it collected no test: that is a failure here, as is anything non-zero.
# Two workers (pytest-xdist), one per core: a third of a one-process run is waiting (on a
# broker, a lease, a JVM), which the other worker fills. tests/scheduling.py groups the tests
# (one Spark driver for all its users, a module's fixtures on one worker), heaviest first.
# `-n 0` after the command runs them all in this process.
.venv/bin/python -m pytest -n 2 --dist loadscope "$@"
