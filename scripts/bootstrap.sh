#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine; safe to run again (a warm run takes
# seconds). Installs Java 17 and Maven with apt-get when missing (as root), creates .venv with
# the pinned packages, and fetches the pinned jars into the cache (~/.cache/dispatch by
# default, outside the repo), verifying their SHA-256 against stack/jars.lock.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cache="${DISPATCH_PATHS__CACHE:-$HOME/.cache/dispatch}"
mkdir -p "$cache"

say() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

apt_install() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "$1 is missing; install it (Debian: apt-get install $2) and run this again"
  fi
  say "installing $2 with apt-get"
  apt-get update -qq || die "apt-get update failed (no network?)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null || die "apt-get install $2 failed"
}

# --- free disk: the jars, the venv and Spark's scratch space need a few GB -----------------
free_kb=$(df -Pk "$cache" | awk 'NR==2 {print $4}')
[ "${free_kb:-0}" -ge 3000000 ] || die "less than 3 GB free under $cache (df says ${free_kb} kB)"

# --- Python 3.11 ---------------------------------------------------------------------------
python="${DISPATCH_PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python="$candidate"; break
    fi
  done
fi
[ -n "$python" ] || die "Python 3.11 is needed (set DISPATCH_PYTHON to its path)"

# --- Java 17+ and Maven --------------------------------------------------------------------
java_major() { java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print v[1]; exit}'; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  apt_install "Java 17+" openjdk-17-jdk-headless
fi
command -v mvn >/dev/null 2>&1 || apt_install "Maven" maven

# --- Chromium, for the dashboard's browser tests only (scripts/test.sh asks for it) ----------
if [ "${1:-}" = "--with-browser" ]; then
  command -v chromium >/dev/null 2>&1 || apt_install "Chromium" chromium
fi

# --- the virtualenv ------------------------------------------------------------------------
# Reinstall only when the pins changed: the stamp holds the hash of what was installed.
stamp_value=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
stamp=.venv/.dispatch-installed
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  say "creating .venv with $python"
  rm -rf .venv
  "$python" -m venv .venv || die "could not create .venv (is python3.11-venv installed?)"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$stamp_value" ]; then
  say "installing Python packages (pinned by constraints.txt)"
  pip_flags=(--disable-pip-version-check -q --cache-dir "$cache/pip")
  .venv/bin/python -m pip install "${pip_flags[@]}" --upgrade pip \
    || die "pip could not reach PyPI (no network?)"
  .venv/bin/python -m pip install "${pip_flags[@]}" -c constraints.txt -e ".[server,dev]" \
    || die "pip install failed: see the lines above"
  echo "$stamp_value" > "$stamp"
fi

# --- the jars ------------------------------------------------------------------------------
.venv/bin/python -m dispatch.stack.jars fetch || die "the jars could not be fetched or verified"

# --- class-data-sharing archives: a third off every broker and Spark driver start -----------
# Made once per set of jars (about two minutes: a broker and a Spark driver run and write the
# classes they loaded); skipped when they exist. Without them every JVM still starts, slower.
.venv/bin/python -m dispatch.streaming.class_training >"$cache/class-training.log" 2>&1 \
  || say "warning: no class-data-sharing archive was made (JVMs start slower); see $cache/class-training.log"
say "ready: .venv and the jars in $cache"
