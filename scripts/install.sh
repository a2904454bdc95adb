#!/usr/bin/env bash
# Installs everything lodger's tests and checks need, on a fresh machine, into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: lodger needs Python >= 3.11 (found $("$python" --version))" >&2
  exit 1
}
# Process sandboxes the shell tool runs in (bubblewrap) and the gVisor backend (runsc).
if ! { command -v bwrap && command -v runsc; } >/dev/null && command -v apt-get >/dev/null \
  && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq bubblewrap runsc >/dev/null
fi
# The HTTP host's timeline page is tested in Debian's headless Chromium (driven by
# Playwright with the system executable; no browser download).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
command -v chromium >/dev/null || { echo "error: install chromium (apt-get install -y chromium)" >&2; exit 1; }
command -v bwrap >/dev/null || { echo "error: install bubblewrap (apt-get install -y bubblewrap)" >&2; exit 1; }
command -v runsc >/dev/null || { echo "error: install gVisor (apt-get install -y runsc)" >&2; exit 1; }
# PostgreSQL server binaries (initdb, pg_ctl) for the control plane's tests, which start a
# private server in a temp dir (as the package's `postgres` user when run as root).
pg_bin() { ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -n 1; }
if [ -z "$(pg_bin)" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
[ -n "$(pg_bin)" ] || [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ] || {
  echo "error: install the PostgreSQL server (apt-get install -y postgresql): the tests need initdb and pg_ctl" >&2
  exit 1
}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# dev takes every extra, evals (pydantic-evals, for lodger eval) among them
.venv/bin/python -m pip install --quiet -e '.[dev,evals]'
# Reference MCP servers the tests launch as subprocesses: project-local, from the lockfile.
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
command -v npm >/dev/null || { echo "error: the tests need node and npm (>= 20)" >&2; exit 1; }
(cd tests/mcp_servers && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
# s3rver: an S3 server that ignores If-None-Match, which lodger must refuse (tests/storage)
(cd tests/s3_servers && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
# axe-core, the accessibility checker the console's browser tests inject (tests/browser)
(cd tests/browser && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
# the stream protocols' own clients (Vercel AI SDK, AG-UI), driven against a real host
(cd tests/js_clients && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
echo "installed: .venv (run: source .venv/bin/activate, or use .venv/bin/lodger)"
