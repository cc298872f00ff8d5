#!/usr/bin/env bash
# The project's one "run it" command: sets everything up, then starts the local stack in the
# foreground (Ctrl-C stops it). It becomes `dispatch demo` once the demo lands.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/dispatch up "$@"
