#!/usr/bin/env bash
# Installs everything lodger's tests and checks need, on a fresh machine, into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: lodger needs Python >= 3.11 (found $("$python" --version))" >&2
  exit 1
}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
echo "installed: .venv (run: source .venv/bin/activate, or use .venv/bin/lodger)"
