#!/usr/bin/env bash
# Runs every check: lint, format, strict types, the docs build (warnings are errors), and
# the whole test suite (which runs every example in README.md and docs/).
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
echo "== docs (mkdocs build --strict)"
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 "$bin/mkdocs" build --strict --site-dir "$site"
rm -rf "$site"
echo "== pytest";       "$bin/pytest" -q "${fast[@]}" "$@"
