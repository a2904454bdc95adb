#!/usr/bin/env bash
# Runs every check: lint, format, strict types, and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
echo "== ruff check";   "$bin/ruff" check src tests bench
echo "== ruff format";  "$bin/ruff" format --check src tests bench
echo "== mypy (strict)"; "$bin/mypy"
echo "== pytest";       "$bin/pytest" -q "$@"
