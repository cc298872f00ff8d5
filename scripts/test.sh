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
.venv/bin/python -m pytest "$@"
