"""An adversarial audit of code mode: cells written to hurt the host, not to do work.

Each test is a cell a hostile (or careless) model could send. Whatever it does, the
host's event loop keeps running, every limit is enforced by the host, the model gets a
structured diagnostic (never a host exception's name), and nothing outside the cell's
interpreter grows without bound."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cell_harness import Cells, cell_result, make_agent

from lodger.events import ToolDispatched, ToolResponded
from lodger.substrates.codemode import CellLimits
from lodger.tools import Tool, tool


def hostile_tools(counts: dict[str, int]) -> list[Tool]:
    @tool(nestable=True, recovery="idempotent")
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        counts["add"] = counts.get("add", 0) + 1
        return a + b

    @tool(nestable=True)
    async def deep(n: int) -> str:
        """Text that is JSON nested ``n`` deep (a hostile file's content, say)."""
        return "[" * n + "]" * n

    return [add, deep]


async def run_cell(
    tmp_path: Path, code: str, *, language: str = "javascript", **kw: Any
) -> tuple[str, dict[str, Any], dict[str, int], list[Any]]:
    counts: dict[str, int] = {}
    agent = make_agent(tmp_path, Cells(code), hostile_tools(counts), language=language, **kw)
    result = await agent.run("go", session="s")
    assert result.status == "completed"
    events = await agent.session("s").events()
    status, content = cell_result(events)
    return status, content, counts, events


class LoopWatch:
    """Counts ticks of the event loop while a cell runs: a blocked loop stops ticking."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest_gap = 0.0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.longest_gap = max(self.longest_gap, now - last)
            last = now
            self.ticks += 1


async def watched(tmp_path: Path, code: str, **kw: Any) -> tuple[dict[str, Any], LoopWatch]:
    watch = LoopWatch()
    ticker = asyncio.ensure_future(watch.run())
    try:
        # a guard far past the cell's wall time: the cell's own limit must end it first
        status, content, _, _ = await asyncio.wait_for(run_cell(tmp_path, code, **kw), 60)
    finally:
        ticker.cancel()
    assert status == "error"
    return content, watch


WALL = CellLimits(wall_time=1.0)


@pytest.mark.parametrize(
    "code",
    [
        # a call it does not await, then a loop that never yields: the call's arguments
        # must not be read from the busy isolate on the event loop
        "tools.add({a: 1, b: 1});\nwhile (true) {}",
        # a loop of microtasks: no evaluation of ours is running, so only closing the
        # isolate stops it, and nothing may wait on the isolate before that
        "for (;;) await null;",
        # a result that settles while a stray loop of microtasks spins forever
        "(async () => { for (;;) await null; })();\nreturn 1;",
        # calls in a loop that never yields: bounded, and the wall time still holds
        "for (;;) tools.add({a: 1, b: 1});",
    ],
    ids=["unawaited-call-then-busy", "microtask-loop", "stray-microtask-loop", "call-flood"],
)
@pytest.mark.timeout(90, method="thread")  # a regression hangs the loop: fail, never hang
async def test_a_busy_cell_never_blocks_the_event_loop(tmp_path: Path, code: str) -> None:
    content, watch = await watched(tmp_path, code, limits=WALL)
    assert (content["error"]["kind"], content["error"].get("limit")) == (
        "limit_exceeded",
        "wall_time",
    ), content
    # the loop kept running while the cell spun (generous for a loaded machine)
    assert watch.ticks >= 5 and watch.longest_gap < 5.0, (watch.ticks, watch.longest_gap)


async def test_calls_past_the_budget_are_refused_inside_the_cell(tmp_path: Path) -> None:
    """A flood of calls the cell never awaits: one past the budget reaches the host (which
    stops the cell), the rest are refused inside the isolate; malformed calls count too."""
    code = (
        "const ps = [];\n"
        "for (let i = 0; i < 10000; i++) ps.push(tools.add(i % 2 ? {a: i, b: 0} : [i]));\n"
        "const r = await Promise.allSettled(ps);\n"
        "return r.filter((x) => x.status === 'rejected').length;"
    )
    status, content, counts, events = await run_cell(
        tmp_path, code, limits=CellLimits(nested_calls=4)
    )
    assert status == "error"
    assert (content["error"]["kind"], content["error"]["limit"]) == (
        "limit_exceeded",
        "nested_calls",
    )
    nested = [e for e in events if e.parent_call_id == "cell0"]
    t1s = [e.call_id for e in nested if isinstance(e.body, ToolDispatched)]
    t2s = [e.call_id for e in nested if isinstance(e.body, ToolResponded)]
    assert counts.get("add", 0) <= len(t1s) <= 2  # four attempts, two of them malformed
    assert sorted(t1s) == sorted(t2s)  # stopping the cell settled what it had started


@pytest.mark.parametrize(
    "code",
    [
        "return function () {};",
        "return Symbol('s');",
        "return {toJSON() { return undefined; }};",
        "return 10n;",
        "const a = {}; a.self = a; return a;",
    ],
    ids=["function", "symbol", "tojson-undefined", "bigint", "cycle"],
)
async def test_a_value_with_no_json_form_is_result_not_json(tmp_path: Path, code: str) -> None:
    status, content, _, _ = await run_cell(tmp_path, code)
    assert status == "error"
    assert content["error"]["kind"] == "result_not_json", content
    assert "exec failed" not in json.dumps(content)


@pytest.mark.parametrize(
    "code",
    [
        "JSON.stringify = () => 'garbage';\nreturn 1;",
        "JSON.parse = () => ({ok: 'forged'});\nreturn await tools.add({a: 1, b: 2});",
        "Promise.prototype.then = function () { return this; };\nreturn 1;",
        "Object.defineProperty(Object.prototype, 'toJSON', {value: () => 'x'});\nreturn 1;",
        "Array.prototype.toJSON = function () { return 5; };\nreturn 1;",
        # text that closes the wrapper and runs at the top level of the script
        'return 1})()); ((async () => { return \'{"ok": 5, "logs": 7}\';',
    ],
    ids=["stringify", "parse", "then", "object-tojson", "array-tojson", "wrapper-escape"],
)
async def test_a_cell_that_replaces_the_runtime_gets_a_diagnostic(
    tmp_path: Path, code: str
) -> None:
    """The cell can break its own runtime, never the host: whatever text comes out of the
    isolate is read in a fixed shape or refused as a diagnostic."""
    status, content, _, events = await run_cell(tmp_path, code, limits=WALL)
    text = json.dumps(content)
    assert "exec failed" not in text and "Error:" not in text.split("message")[0], content
    assert set(content) <= {"result", "error", "logs", "logs_dropped"}, content
    if status == "error":
        assert content["error"]["kind"] in {"runtime_error", "result_not_json"}, content
    # the cell's T2 is recorded either way
    assert any(isinstance(e.body, ToolResponded) and e.call_id == "cell0" for e in events)


@pytest.mark.parametrize("language", ["javascript", "python"])
async def test_a_tool_result_nested_too_deep_for_json_arrives_as_text(
    tmp_path: Path, language: str
) -> None:
    """A nested call's text result that parses as JSON too deep for the host (a hostile
    file's content, say) reaches the cell as text, promptly: it used to kill the reply
    (the JavaScript cell waited out its wall time, the Python cell got a RecursionError)."""
    code = {
        "javascript": "const r = await tools.deep({n: 5000});\nreturn [typeof r, r.length];",
        "python": "r = await deep(n=5000)\n[type(r).__name__, len(r)]",
    }[language]
    status, content, _, _ = await run_cell(
        tmp_path, code, language=language, limits=CellLimits(wall_time=20.0)
    )
    assert (status, content) == (
        "ok",
        {"result": ["string" if language == "javascript" else "str", 10000]},
    )


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("{1, 2}", "set"),
        ('b"abc"', "bytes"),
        ('float("nan")', "NaN and Infinity"),
        ('[float("inf")]', "NaN and Infinity"),
        ("10 ** 5000", "too many digits"),
        ("{(1, 2): 3}", "keys must be"),
        ("x = []\nfor i in range(100000):\n    x = [x]\nx", "nested too deeply"),
    ],
    ids=["set", "bytes", "nan", "infinity", "huge-int", "tuple-key", "deep"],
)
async def test_a_python_value_with_no_json_form_is_result_not_json(
    tmp_path: Path, code: str, why: str
) -> None:
    """It used to be 'exec failed: TypeError ...' (or, for NaN and Infinity, a result that
    is not JSON at all in the cell's T2)."""
    status, content, _, events = await run_cell(tmp_path, code, language="python")
    assert status == "error", content
    assert content["error"]["kind"] == "result_not_json" and why in content["error"]["message"]
    t2 = next(e for e in events if isinstance(e.body, ToolResponded) and e.call_id == "cell0")
    json.loads(t2.body.content, parse_constant=_refuse)  # strict JSON, always


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} in a cell's result")


async def test_python_print_output_is_bounded_as_it_arrives(tmp_path: Path) -> None:
    """A cell printing in a loop kept every chunk in the host until the cell ended (2.4 GB
    in 10 s here); now only what the log limit keeps is held, the rest counted."""
    import tracemalloc

    code = "for i in range(3000):\n    print('x' * 10000)\n'done'"
    tracemalloc.start()
    try:
        status, content, _, _ = await run_cell(
            tmp_path, code, language="python", limits=CellLimits(log_bytes=1000)
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (status, content["result"]) == ("ok", "done")
    assert content["logs_dropped"] == 3000 and "logs" not in content
    assert peak < 10_000_000, peak  # 30 MB printed


# Walks every object and function a cell can reach from globalThis (own properties,
# accessors' functions, prototypes; no getter is called) and names what it must not find.
REACHABLE = """
const banned = new Set(['ArrayBuffer', 'SharedArrayBuffer', 'DataView', 'TypedArray',
  'Int8Array', 'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array',
  'Int32Array', 'Uint32Array', 'Float16Array', 'Float32Array', 'Float64Array',
  'BigInt64Array', 'BigUint64Array', 'DateTimeFormat', 'Collator', 'Segmenter',
  'NumberFormat', 'PluralRules', 'RelativeTimeFormat', 'ListFormat', 'DisplayNames',
  'Locale', 'DurationFormat', 'Memory', 'Instance', 'Module']);
const seen = new Set(), found = new Set(), stack = [globalThis];
while (stack.length) {
  const o = stack.pop();
  if ((typeof o !== 'object' && typeof o !== 'function') || o === null || seen.has(o)) continue;
  seen.add(o);
  if (typeof o === 'function') {
    const d = Object.getOwnPropertyDescriptor(o, 'name');
    const name = d && typeof d.value === 'string' ? d.value : '';
    if (banned.has(name)) found.add(name);
    if (name === 'Date' && o !== Date) found.add('the real Date');
    if (name === 'now' && o.call(undefined) !== 0) found.add('a running now()');
  }
  stack.push(Object.getPrototypeOf(o));
  for (const key of Reflect.ownKeys(o)) {
    const d = Object.getOwnPropertyDescriptor(o, key);
    if (d) stack.push(d.value, d.get, d.set);
  }
}
return {found: [...found].sort(), reached: seen.size};
"""


async def test_no_memory_outside_the_heap_and_no_running_clock_is_reachable(
    tmp_path: Path,
) -> None:
    """Typed arrays and Intl objects hold memory the heap limit does not count (a cell
    keeping them grew the host past 2 GB under a 64 MiB limit); the real Date was the
    prototype of the frozen one, and Intl.DateTimeFormat#format() and Temporal.Now read
    the real clock."""
    status, content, _, _ = await run_cell(tmp_path, REACHABLE)
    assert status == "ok", content
    assert content["result"]["found"] == [] and content["result"]["reached"] > 300


async def test_the_clock_is_frozen_everywhere_a_cell_looks(tmp_path: Path) -> None:
    code = (
        "class Later extends Date {}\n"
        "const proto = Object.getPrototypeOf(new Date()).constructor;\n"
        "return [Date.now(), new Date().getTime(), new proto().getTime(), new Later().getTime(),"
        " new Later(5).getTime(), new Later(5) instanceof Date, Date(),"
        " typeof Intl, typeof Temporal, new Date(Date.UTC(2020, 1, 3)).getUTCDate()];"
    )
    status, content, _, _ = await run_cell(tmp_path, code)
    assert status == "ok", content
    assert content["result"][:6] == [0, 0, 0, 0, 5, True]
    assert content["result"][6].startswith("Thu Jan 01 1970")
    assert content["result"][7:] == ["undefined", "undefined", 3]


async def test_a_buffer_bomb_is_refused_at_once(tmp_path: Path) -> None:
    code = "const kept = [];\nfor (;;) kept.push(new Uint8Array(1 << 24).fill(1));"
    status, content, _, _ = await run_cell(tmp_path, code, limits=WALL)
    assert status == "error"
    assert content["error"]["kind"] == "runtime_error"
    assert content["error"]["message"] == "ReferenceError: Uint8Array is not defined"


async def test_console_output_is_bounded_in_utf8_bytes(tmp_path: Path) -> None:
    """log_bytes is a limit in bytes; it was counted in UTF-16 units in JavaScript, so
    non-ASCII output kept up to three times the limit."""
    code = "for (let i = 0; i < 50; i++) console.log('\u20ac'.repeat(10), '\U0001f600');\nreturn 1;"
    status, content, _, _ = await run_cell(tmp_path, code, limits=CellLimits(log_bytes=200))
    assert (status, content["result"]) == ("ok", 1)
    kept = sum(len(line.encode()) + 1 for line in content["logs"])
    assert 0 < kept <= 200 and content["logs_dropped"] == 50 - len(content["logs"])


def _monty_workers() -> list[int]:
    """This process's Monty worker processes (found by their command line)."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and b"monty" in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_python_worker_killed_mid_cell_ends_that_cell_only(tmp_path: Path) -> None:
    """SIGKILL of the Monty worker running a cell (after a nested call it made committed):
    the cell ends with a diagnostic, its nested call's facts stay, the next cell runs."""
    import os
    import signal

    ran = asyncio.Event()

    @tool(nestable=True)
    async def mark() -> str:
        """Mark the cell as running."""
        ran.set()
        return "marked"

    model = Cells("await mark()\nwhile True:\n    pass", "await mark()\n'again'")
    agent = make_agent(
        tmp_path, model, [mark], language="python", limits=CellLimits(wall_time=30.0)
    )
    turn = asyncio.ensure_future(agent.run("go", session="s"))
    await asyncio.wait_for(ran.wait(), 30)
    workers = _monty_workers()
    assert workers, "no Monty worker found"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    result = await asyncio.wait_for(turn, 30)
    assert result.status == "completed"
    events = await agent.session("s").events()
    status, content = cell_result(events, "cell0")
    assert status == "error" and content["error"]["kind"] == "runtime_error"
    nested = [e for e in events if e.parent_call_id == "cell0"]
    assert [type(e.body) for e in nested] == [ToolDispatched, ToolResponded]
    assert cell_result(events, "cell1") == ("ok", {"result": "again"})


@pytest.mark.parametrize("language", ["javascript", "python"])
async def test_a_cell_that_throws_after_its_calls_keeps_their_facts(
    tmp_path: Path, language: str
) -> None:
    code = {
        "javascript": "const x = await tools.add({a: 1, b: 2});\nthrow new Error('after ' + x);",
        "python": "x = await add(a=1, b=2)\nraise ValueError(f'after {x}')",
    }[language]
    status, content, counts, events = await run_cell(tmp_path, code, language=language)
    assert status == "error" and content["error"]["kind"] == "runtime_error"
    assert "after 3" in content["error"]["message"]
    assert counts == {"add": 1}
    nested = [e for e in events if e.parent_call_id == "cell0"]
    (t2,) = [e for e in nested if isinstance(e.body, ToolResponded)]
    assert (t2.body.status, t2.body.content, t2.visibility) == ("ok", "3", "hidden")


async def test_a_cell_that_returns_with_a_call_in_flight_settles_it(tmp_path: Path) -> None:
    """The cell's result comes back; the call it did not wait for is cancelled and its
    T1 and T2 are both in the log, linked to the cell."""
    started = asyncio.Event()

    @tool(nestable=True)
    async def slow() -> str:
        """Never finishes on its own."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    code = "tools.slow({});\nawait tools.add({a: 1, b: 1});\nreturn 'early';"
    agent = make_agent(tmp_path, Cells(code), [*hostile_tools({}), slow])
    result = await asyncio.wait_for(agent.run("go", session="s"), 60)
    assert result.status == "completed" and started.is_set()
    events = await agent.session("s").events()
    assert cell_result(events) == ("ok", {"result": "early"})
    by_tool = {
        e.body.tool: e.call_id
        for e in events
        if isinstance(e.body, ToolDispatched) and e.parent_call_id == "cell0"
    }
    (slow_t2,) = [
        e for e in events if isinstance(e.body, ToolResponded) and e.call_id == by_tool["slow"]
    ]
    assert slow_t2.body.status == "cancelled"


async def test_promise_all_past_the_budget_is_limit_exceeded(tmp_path: Path) -> None:
    """Calls the prelude refuses past the budget stop the cell with limit_exceeded even when
    Promise.all rejects at once, before the host saw any call; none of them starts."""
    code = "await Promise.all(Array.from({length: 100}, (_, i) => tools.add({a: i, b: 1})));"
    status, content, counts, events = await run_cell(tmp_path, code)
    assert status == "error"
    assert content["error"] == {
        "kind": "limit_exceeded",
        "limit": "nested_calls",
        "message": "the cell made more than 32 nested calls",
    }
    assert counts == {}
    assert not [e for e in events if e.parent_call_id == "cell0"]


@pytest.mark.parametrize(
    ("code", "stack"),
    [
        ("function f() { null.x; }\nf();", "at f (cell:1:21)\nat cell:2:1"),
        # a tool's error is made by the prelude: no frame of it is the cell's
        ("try { await tools.add({a: 'x', b: 1}); } catch (e) { throw e; }", None),
        ("await tools.add({a: 1, b: 1});\ntools.add(5, 6).then.x.y;", "at cell:2:23"),
    ],
    ids=["plain", "tool-error", "after-a-call"],
)
async def test_a_stack_names_only_the_cells_own_lines(
    tmp_path: Path, code: str, stack: str | None
) -> None:
    """Frames of the prelude and of the host's evaluations used to be renumbered as cell
    lines (``at value (cell:42:24)``, ``at cell:0:1``, the wrapper's closing line)."""
    status, content, _, _ = await run_cell(tmp_path, code)
    assert status == "error" and content["error"]["kind"] == "runtime_error"
    assert content["error"].get("stack") == stack, content


async def test_source_nested_past_the_parser_is_a_parse_error(tmp_path: Path) -> None:
    code = "return " + "[" * 30000 + "]" * 30000 + ";"
    status, content, _, _ = await run_cell(tmp_path, code)
    assert status == "error"
    assert content["error"] == {
        "kind": "parse_error",
        "message": "RangeError: Maximum call stack size exceeded",
    }
    counts: dict[str, int] = {}
    source = "(" * 30000 + "1" + ")" * 30000
    agent = make_agent(tmp_path / "py", Cells(source), hostile_tools(counts), language="python")
    assert (await agent.run("go", session="s")).status == "completed"
    status, content = cell_result(await agent.session("s").events())
    assert (status, content["error"]["kind"]) == ("error", "parse_error")
    assert content["error"]["message"] == "SyntaxError: Source is too deeply nested"
    # the traceback quotes the 60 KB line: clipped, so the result stays whole JSON
    assert len(content["error"]["stack"]) < 4100


@pytest.mark.parametrize(
    ("name", "tool"),
    [('"it\'s"', "it's"), ("'x'.repeat(100000)", "x" * 200 + " ... (99800 more characters)")],
    ids=["apostrophe", "huge"],
)
async def test_an_unknown_tool_is_named_exactly_and_briefly(
    tmp_path: Path, name: str, tool: str
) -> None:
    """The refused name was cut out of the message at its first apostrophe (``it's`` gave
    ``s" is bound``), and a 100 KB name went whole into the diagnostic, past the call's
    result limit, so the pipeline cut the result mid-JSON."""
    status, content, _, _ = await run_cell(tmp_path, f"await tools[{name}]({{}});")
    assert status == "error" and content["error"]["kind"] == "unknown_tool"
    assert content["error"]["tool"] == tool
    assert len(content["error"]["message"]) < 2100


async def test_a_damaged_nested_fact_fails_closed(tmp_path: Path) -> None:
    """A nested call's T2 changed in the SQLite file (its result forged): reading, resuming
    or continuing the session all refuse with the offset, nothing is trusted."""
    import sqlite3

    from lodger.errors import CorruptLogError

    counts: dict[str, int] = {}
    agent = make_agent(
        tmp_path, Cells("return await tools.add({a: 1, b: 2});"), [*hostile_tools(counts)]
    )
    assert (await agent.run("go", session="s")).status == "completed"
    db = sqlite3.connect(tmp_path / "state" / "log.sqlite3")
    try:
        rows = db.execute('SELECT "offset", data FROM events WHERE session_id = ?', ("s",))
        damaged = None
        for offset, data in rows.fetchall():
            event = json.loads(data)
            if event.get("parent_call_id") and event["body"]["kind"] == "tool_responded":
                event["body"]["content"] = "30"
                damaged = offset
                db.execute(
                    'UPDATE events SET data = ? WHERE session_id = ? AND "offset" = ?',
                    (json.dumps(event).encode(), "s", offset),
                )
        db.commit()
    finally:
        db.close()
    assert damaged is not None
    again = make_agent(tmp_path, Cells("return 1;"), hostile_tools(counts))
    for attempt in (
        again.session("s").events(),
        again.resume("s"),
        again.run("more", session="s"),
    ):
        with pytest.raises(CorruptLogError) as caught:
            await attempt
        assert caught.value.code == "digest_mismatch" and f"offset {damaged}" in str(caught.value)
    assert counts == {"add": 1}


@pytest.mark.parametrize("language", ["javascript", "python"])
async def test_a_nested_call_with_huge_arguments_is_refused_before_its_t1(
    tmp_path: Path, language: str
) -> None:
    """Nested arguments are kept in the log: one 20 MB string went whole into a T1, so 32
    calls of one cell could write ~1 GB. Past ``argument_bytes`` the cell stops with
    limit_exceeded and nothing of the call is written."""
    code = {
        "javascript": "const s = 'x'.repeat(300000);\nreturn await tools.add({a: 1, b: 2, s});",
        "python": "s = 'x' * 300000\nawait add(a=1, b=2, s=s)",
    }[language]
    status, content, counts, events = await run_cell(
        tmp_path, code, language=language, limits=CellLimits(argument_bytes=100_000)
    )
    assert status == "error"
    assert (content["error"]["kind"], content["error"]["limit"]) == (
        "limit_exceeded",
        "argument_bytes",
    )
    assert counts == {} and not [e for e in events if e.parent_call_id == "cell0"]
    written = sum(f.stat().st_size for f in (tmp_path / "state").glob("log.sqlite3*"))
    assert written < 1_000_000, written


async def test_python_arguments_with_no_json_form_are_a_tool_error(tmp_path: Path) -> None:
    code = "try:\n    await add(a={1, 2}, b=1)\nexcept RuntimeError as e:\n    r = str(e)\nr"
    status, content, counts, _ = await run_cell(tmp_path, code, language="python")
    assert (status, content["result"]) == (
        "ok",
        "invalid_arguments: the arguments of tools.add are not JSON",
    )
    assert counts == {}


@pytest.mark.parametrize(
    "code",
    [
        "const a = [];\nfor (let i = 0;; i++) { await null; a.push('x'.repeat(1000) + i); }",
        "const a = [];\nawait tools.add({a: 1, b: 1});\n"
        "for (;;) a.push('x'.repeat(1000) + a.length);",
    ],
    ids=["in-microtasks", "after-a-delivery"],
)
async def test_memory_is_bounded_outside_the_first_evaluation(tmp_path: Path, code: str) -> None:
    """The heap limit trips while no evaluation of the host's is running (a chain of
    microtasks) or inside a delivery: still a memory diagnostic, promptly."""
    status, content, _, _ = await run_cell(
        tmp_path, code, limits=CellLimits(memory=16 * 1024 * 1024, wall_time=20.0)
    )
    assert status == "error"
    assert (content["error"]["kind"], content["error"]["limit"]) == ("limit_exceeded", "memory")
