#!/usr/bin/env bash
# Proves that the core install (`pip install lodger`, no extras) is enough for the core:
# builds the wheel of this tree, installs it with its declared dependencies only in a fresh
# venv in a temp dir (no package of the shared .venv, no extra), and there imports
# every module of lodger (each imports, or raises MissingExtraError naming its extra), runs
# `lodger demo` and a library example (a scripted model, SQLite), and checks that the parts
# that need an extra (`lodger serve`, --store s3://, a PostgreSQL control plane, code
# mode, an OpenAI model) say so in one line and exit 2. Called by scripts/check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pip=(.venv/bin/python -m pip --quiet --disable-pip-version-check)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lodger-core-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
started=$SECONDS
fail() { echo "check_core: $*" >&2; exit 1; }

# The wheel of the working tree as it is (built from a copy, so nothing is left behind
# here), built while a fresh venv gets the core's dependencies: from a wheelhouse kept in
# the user's cache, filled from the package index when it lacks one (the first run, or
# after pyproject.toml changed them).
mkdir -p "$tmp/tree" "$tmp/home" "$tmp/work"
cp -r pyproject.toml README.md src "$tmp/tree/"
find "$tmp/tree" -name __pycache__ -prune -exec rm -rf {} +
"${pip[@]}" wheel --no-deps --wheel-dir "$tmp/dist" "$tmp/tree" > "$tmp/build.log" 2>&1 &
building=$!
.venv/bin/python -c 'import sys, tomllib
print(*tomllib.load(sys.stdin.buffer)["project"]["dependencies"], sep="\n")' \
    < pyproject.toml > "$tmp/core.txt"
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/lodger/core-wheels"
mkdir -p "$wheels"
.venv/bin/python -m venv --without-pip "$tmp/venv"
into=("${pip[@]}" --python "$tmp/venv/bin/python" install --no-index --find-links "$wheels")
if ! "${into[@]}" -r "$tmp/core.txt" 2> /dev/null; then
    "${pip[@]}" download --dest "$wheels" -r "$tmp/core.txt"
    "${into[@]}" -r "$tmp/core.txt"
fi
wait "$building" || fail "building the wheel failed: $(cat "$tmp/build.log")"
wheel=("$tmp"/dist/lodger-*.whl)
# the wheel's own metadata: what it requires must be what is installed (or in the wheelhouse)
"${into[@]}" "${wheel[0]}"

# everything below runs in the venv, away from this tree and from the caller's settings
run() {
    (cd "$tmp/work" && env -i PATH="$tmp/venv/bin:/usr/bin:/bin" HOME="$tmp/home" \
        LODGER_CONFIG_DIR="$tmp/home/config" TMPDIR="$tmp" "$@")
}

run python - <<'EOF'
import importlib, importlib.metadata, pkgutil, re
import lodger
from lodger._core.extras import EXTRAS
from lodger.errors import MissingExtraError

installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in importlib.metadata.distributions()}
optional = {name for packages in EXTRAS.values() for name in packages}
assert not installed & optional, f"an extra's packages in the core venv: {installed & optional}"
print(f"core venv: {len(installed)} distributions: {' '.join(sorted(installed))}")

ok, extra = [], {}
for info in pkgutil.walk_packages(lodger.__path__, "lodger."):
    name = info.name
    # __main__ runs the CLI; the conformance suites are pytest test classes (test code)
    if name == "lodger.__main__" or name.endswith("_conformance"):
        continue
    if any(name.startswith(f"{p}.") for p in extra):  # under a package that needs an extra
        continue
    try:
        importlib.import_module(name)
    except MissingExtraError as error:
        extra[name] = error.extra
        continue
    ok.append(name)
expected = {
    "anthropic", "client", "codemode", "evals", "gemini", "host", "mcp", "openai", "postgres", "s3"
}
assert set(extra.values()) == expected, f"extras named on import: {sorted(set(extra.values()))}"
assert "lodger.runtime.agent" in ok and "lodger.cli._run" in ok, ok
print(f"core venv: {len(ok)} modules import with the core only; {len(extra)} need an extra")
EOF
run lodger --version
run lodger demo --state "$tmp/demo" > "$tmp/demo.out" || fail "lodger demo failed: $(cat "$tmp/demo.out")"
grep -q "turn completed" "$tmp/demo.out" || fail "lodger demo did not complete a turn"
run lodger log verify "$(run lodger sessions --state "$tmp/demo" --json | run python -c \
    'import json, sys; print(json.load(sys.stdin)["sessions"][0]["session_id"])')" --state "$tmp/demo"
run python "$root/examples/quickstart_sync.py" > "$tmp/example.out" \
    || fail "examples/quickstart_sync.py failed: $(cat "$tmp/example.out")"
grep -q "^completed 3$" "$tmp/example.out" || fail "the example's output: $(cat "$tmp/example.out")"

# a part without its extra: one line naming the extra, and exit 2 (a usage error)
needs() {
    local extra=$1 status=0
    shift
    run timeout 60 lodger "$@" > "$tmp/needs.out" 2>&1 || status=$?
    local out
    out=$(cat "$tmp/needs.out")
    [[ $status == 2 ]] || fail "lodger $* exited $status, not 2: $out"
    [[ $(wc -l < "$tmp/needs.out") == 1 ]] || fail "lodger $* printed more than one line: $out"
    [[ $out == *"pip install 'lodger[$extra]'"* ]] || fail "lodger $* does not name [$extra]: $out"
}
needs host serve --state "$tmp/state"
needs s3 sessions --store "file://$tmp/objects"
needs postgres worker --state "$tmp/state" --control postgresql://lodger@127.0.0.1:1/lodger
needs codemode run "hi" --model test --code-mode javascript --state "$tmp/state"
needs openai run "hi" --model openai:gpt-4.1 --state "$tmp/state"
needs gemini run "hi" --model gemini:gemini-2.5-flash --state "$tmp/state"
needs mcp tools list --mcp "time=mcp-server-time"
echo "suite = []" > "$tmp/work/evals.py"
needs evals eval evals.py --state "$tmp/state"
echo "check_core: the core venv passed in $((SECONDS - started)) s"
