"""Run one benchmark and record its figures in bench/results/<name>.jsonl.

Every benchmark in bench/ prints a table and, last, one line of JSON with its figures.
This runs ``bench/<name>.py`` with the arguments given, passes its output through, and
appends one JSON line to ``bench/results/<name>.jsonl``: the date (UTC), the machine
(CPU model, CPU count, OS; ``--machine`` or ``LODGER_BENCH_MACHINE`` adds a label), the
exact command, the git commit and the figures. The docs site's benchmarks page is
rendered from those files (bench/results.py), so a figure never appears without its
date, machine and command.

Example:
    .venv/bin/python bench/record.py log_append --quick
    .venv/bin/python bench/record.py --machine "CI, 2 cores" workers --quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(label: str | None) -> str:
    described = f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    return f"{label} ({described})" if label else described


def git_commit() -> str | None:
    done = subprocess.run(
        ["git", "-C", str(BENCH), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def last_json_object(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--machine", default=os.environ.get("LODGER_BENCH_MACHINE"))
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the .jsonl go")
    parser.add_argument("name", help="a benchmark in bench/, without .py (e.g. log_append)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's arguments")
    args = parser.parse_args(argv)
    script = BENCH / f"{args.name}.py"
    if not script.is_file() or args.name in ("record", "results"):
        print(f"error: no benchmark bench/{args.name}.py", file=sys.stderr)
        return 2
    process = subprocess.Popen(
        [sys.executable, str(script), *args.args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = process.wait()
    if code != 0:
        print(f"error: bench/{args.name}.py exited {code}; nothing recorded", file=sys.stderr)
        return code
    figures = last_json_object(lines)
    if figures is None:
        print(f"error: bench/{args.name}.py did not end with a JSON object", file=sys.stderr)
        return 1
    record = {
        "bench": args.name,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(args.machine),
        "command": " ".join(["python", f"bench/{args.name}.py", *args.args]),
        "commit": git_commit(),
        "source": "recorded",
        "figures": figures,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    with (args.results / f"{args.name}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    print(f"recorded: {args.results / (args.name + '.jsonl')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
