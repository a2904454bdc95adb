#!/usr/bin/env bash
# Runs every check: lint, format, strict types, the core-only install (scripts/check_core.sh:
# the built wheel in a fresh venv without extras), and the whole test suite.
# --fast skips the tests marked slow and spreads the rest over two processes (pytest-xdist):
# a quick lane for development. CI runs everything, in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
fast=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    fast=(-m "not slow" -n 2)
    export LODGER_FAST_LANE=1  # fewer hypothesis examples (tests/conftest.py)
fi
echo "== ruff check";   "$bin/ruff" check src tests bench examples
echo "== ruff format";  "$bin/ruff" format --check src tests bench examples
echo "== mypy (strict)"; "$bin/mypy"
echo "== core install"; bash scripts/check_core.sh
echo "== pytest";       "$bin/pytest" -q "${fast[@]}" "$@"
