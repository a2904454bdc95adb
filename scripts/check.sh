#!/usr/bin/env bash
# Runs every check: lint, format, strict types, the core-only install (scripts/check_core.sh:
# the built wheel in a fresh venv without extras), the docs build (warnings are errors), and
# the whole test suite (which runs every example in README.md and docs/).
# The tests run spread over two processes (pytest-xdist): most wait on subprocesses, fsyncs and
# sockets, so two workers on a 2-core machine halve the wall time. --fast skips the tests
# marked slow: a quick lane for development. CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
lane=(-n 2)
if [[ "${1:-}" == "--fast" ]]; then
    shift
    lane=(-m "not slow" -n 2)
    export LODGER_FAST_LANE=1  # fewer hypothesis examples (tests/conftest.py)
fi
echo "== ruff check";   "$bin/ruff" check src tests bench examples
echo "== ruff format";  "$bin/ruff" format --check src tests bench examples
echo "== mypy (strict)"; "$bin/mypy"
echo "== core install"; bash scripts/check_core.sh
echo "== docs (mkdocs build --strict)"
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 "$bin/mkdocs" build --strict --site-dir "$site"
rm -rf "$site"
# the browser tests' screenshots stay where CI can keep them (build/ is not tracked)
export LODGER_TEST_ARTIFACTS="${LODGER_TEST_ARTIFACTS:-$PWD/build/test-artifacts}"
echo "== pytest";       "$bin/pytest" -q "${lane[@]}" "$@"
