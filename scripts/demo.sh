#!/usr/bin/env bash
# The project's one "run it" command: sets everything up, then runs `dispatch demo` (a stack of
# its own, a mix of jobs, a failover, the state read back from Delta; it ends by itself and
# leaves no process behind). `.venv/bin/dispatch up` then runs the stack in the foreground.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/dispatch demo "$@"
