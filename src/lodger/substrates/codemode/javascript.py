"""JavaScript cells in a fresh V8 isolate (mini-racer).

Each cell gets its own isolate with a hard heap limit and nothing of the host in reach:
no filesystem, network, process, imports, timers, shared memory or WebAssembly, and a
clock frozen at the epoch (``Date.now()`` is 0), so there is no clock to time a side
channel with and nothing outlives the cell. Nothing that holds memory outside the V8 heap
either (the heap limit does not count it): no ``ArrayBuffer``, typed arrays or ``Intl``.
``await tools.NAME(args)`` returns the parsed result or throws a ``ToolError`` with a
``code``.

How values cross: only by cancellable evaluations that return JSON text. A call is queued
inside the isolate; ``__lodger_take()`` hands the queue (and the cell's result, once it
settled) out; the reply comes back in by ``__lodger_deliver(id, text)``. The host takes
again after its first evaluation and after every delivery, the only moments the cell can
have moved on. Nothing else touches the isolate while the cell runs: mini-racer's
callbacks into Python, JS objects read from Python and JS promises awaited from Python
all wait on the isolate's thread without a way to cancel them, so a cell that loops
forever (in code or in a chain of microtasks) would block the whole event loop, its wall
time and every other session with it. A Python exception never crosses into JS either
(it would carry its traceback and host paths): only JSON text written by ``CellHost``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from lodger._core.extras import require
from lodger.substrates.codemode._host import CellHost, Reply
from lodger.substrates.codemode.limits import CellLimits
from lodger.substrates.codemode.substrate import CellOutcome, Diagnostic

with require("codemode", "code mode in JavaScript"):
    from py_mini_racer import (
        JSEvalException,
        JSOOMException,
        JSParseException,
        mini_racer,
    )

__all__ = ["JavaScriptSubstrate"]

_PRELUDE = """
(() => {
  // The prelude's own tools, taken before the cell can replace them.
  const stringify = JSON.stringify, parse = JSON.parse;
  const then = Promise.prototype.then;
  const pending = new Map();
  const outbox = [];
  let next = 0, sent = 0, over = 0, done = null;
  const logs = [];
  let logBytes = 0, dropped = 0;
  const LOG_LIMIT = %(log_limit)d;
  const CALL_LIMIT = %(call_limit)d;
  const show = (v) => {
    if (typeof v === 'string') return v;
    try { const s = stringify(v); return s === undefined ? String(v) : s; }
    catch (e) { return String(v); }
  };
  // the limit is in UTF-8 bytes, as the host counts them (a lone surrogate: 3, as U+FFFD)
  const utf8 = (s) => {
    let n = 0;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c < 0x80) n += 1;
      else if (c < 0x800) n += 2;
      else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length
          && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) { n += 4; i++; }
      else n += 3;
      if (n > LOG_LIMIT) break;  // dropped anyway: no need to count further
    }
    return n;
  };
  const log = (...args) => {
    const line = args.map(show).join(' ');
    const cost = utf8(line) + 1;
    if (logBytes + cost > LOG_LIMIT) { dropped++; return; }
    logBytes += cost;
    logs.push(line);
  };
  globalThis.console = Object.freeze({log, info: log, warn: log, error: log, debug: log});
  class ToolError extends Error {
    constructor(code, message) { super(message); this.name = 'ToolError'; this.code = code; }
  }
  globalThis.ToolError = ToolError;
  const call = (name, args) => new Promise((resolve, reject) => {
    let text;
    try { text = stringify(args === undefined ? {} : args); }
    catch (e) {
      reject(new ToolError('invalid_arguments', 'arguments are not JSON: ' + e.message));
      return;
    }
    // One call past the budget still goes out, so the host sees it and stops the cell;
    // the rest are refused here instead of piling up on the host.
    if (sent >= CALL_LIMIT) {
      over++;
      reject(new ToolError('limit_exceeded',
        'the cell made more than ' + (CALL_LIMIT - 1) + ' nested calls'));
      return;
    }
    sent++;
    const id = next++;
    pending.set(id, {resolve, reject});
    outbox.push([id, name, text === undefined ? 'null' : text]);
  });
  Object.defineProperty(globalThis, '__lodger_take', {value: () => {
    const calls = outbox.splice(0, outbox.length);
    return stringify({calls, done, over});
  }});
  Object.defineProperty(globalThis, '__lodger_deliver', {value: (id, text) => {
    const waiter = pending.get(id);
    if (!waiter) return;
    pending.delete(id);
    const reply = parse(text);
    if ('ok' in reply) waiter.resolve(reply.ok);
    else waiter.reject(new ToolError(reply.error.code, reply.error.message));
  }});
  globalThis.tools = new Proxy(Object.create(null), {
    get: (_, name) => (typeof name === 'string' ? (args) => call(name, args) : undefined),
  });
  const failed = (e) => ({
    name: String((e && e.name) || 'Error'),
    message: String(e && e.message !== undefined ? e.message : e),
    stack: String((e && e.stack) || ''),
    code: e && e.code ? String(e.code) : null,
  });
  const notJson = (why) => stringify({error: {name: 'TypeError', code: 'result_not_json',
    message: 'the cell returned a value that is not JSON: ' + why, stack: ''}, logs, dropped});
  Object.defineProperty(globalThis, '__lodger_finish', {value: (promise) => then.call(promise,
    (v) => {
      let body;
      try { body = stringify(v === undefined ? null : v); }
      catch (e) { done = notJson(e.message); return; }
      // a function, a symbol, or a toJSON that gives undefined: no JSON text at all
      if (typeof body !== 'string') {
        done = notJson('a ' + typeof v + ' has no JSON form');
        return;
      }
      done = '{"ok":' + body + ',"logs":' + stringify(logs) + ',"dropped":' + dropped + '}';
    },
    (e) => { done = stringify({error: failed(e), logs, dropped}); },
  )});
  // Memory outside the V8 heap escapes the heap limit: buffers and typed arrays (their
  // bytes) and Intl objects (ICU's): a cell holding them grew the host past 2 GB under a
  // 64 MiB limit. Intl.DateTimeFormat#format() and Temporal.Now also read the real clock.
  for (const name of ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval',
      'SharedArrayBuffer', 'Atomics', 'WebAssembly', 'performance', '__TimerManager',
      '__timer_manager', 'Realm', 'os', 'd8', 'ArrayBuffer', 'DataView', 'Int8Array',
      'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array', 'Int32Array',
      'Uint32Array', 'Float16Array', 'Float32Array', 'Float64Array', 'BigInt64Array',
      'BigUint64Array', 'Intl', 'Temporal']) {
    try { delete globalThis[name]; } catch (e) { /* not configurable */ }
    if (name in globalThis) globalThis[name] = undefined;  // declared with var: unset
  }
  // The clock stops at the epoch. Date is replaced by a function whose prototype is the
  // real one (instances and subclasses work), and the real constructor is unlinked from
  // everything a cell can reach (a subclass of it would be its prototype: reachable).
  const RealDate = Date, construct = Reflect.construct;
  const dateString = RealDate.prototype.toString;
  const frozenNow = () => 0;
  function FrozenDate(...a) {
    if (new.target === undefined) return dateString.call(construct(RealDate, [0]));
    return construct(RealDate, a.length === 0 ? [0] : a, new.target);
  }
  Object.defineProperty(FrozenDate, 'name', {value: 'Date'});
  FrozenDate.prototype = RealDate.prototype;
  FrozenDate.now = frozenNow;
  FrozenDate.parse = RealDate.parse;
  FrozenDate.UTC = RealDate.UTC;
  Object.defineProperty(RealDate.prototype, 'constructor',
    {value: FrozenDate, writable: true, configurable: true, enumerable: false});
  Object.defineProperty(RealDate, 'now', {value: frozenNow});
  globalThis.Date = FrozenDate;
})();
//# sourceURL=__lodger_prelude
"""


class _Unreadable(Exception):
    """What the isolate handed out is not in the prelude's shape: the cell replaced the
    prelude's objects (``JSON``, a prototype) under it."""


class JavaScriptSubstrate:
    """Runs each cell in a new V8 isolate on the running event loop."""

    language = "javascript"

    async def aclose(self) -> None:
        """Nothing is kept between cells: every cell has its own isolate."""

    async def run(self, source: str, host: CellHost, limits: CellLimits) -> CellOutcome:
        loop = asyncio.get_running_loop()
        with mini_racer(loop) as mr:
            mr.set_hard_memory_limit(limits.memory)
            finished = False
            result = ""
            moved = asyncio.Event()  # a delivery ran: the cell may have moved on

            async def deliver(call_id: int, reply: Reply) -> None:
                if finished:
                    return  # the cell already ended; nothing waits for this reply
                text = json.dumps(reply, ensure_ascii=False)
                try:
                    await mr.eval_cancelable(f"__lodger_deliver({call_id}, {json.dumps(text)})")
                except JSOOMException:
                    host.exceeded = "memory"
                    host.stop("limit_exceeded", f"the cell used more than {limits.memory} bytes")
                except JSEvalException:
                    pass  # terminated with the cell; its outcome is decided elsewhere
                finally:
                    moved.set()

            async def work(call_id: int, name: str, text: str) -> None:
                try:
                    arguments: Any = json.loads(text)
                except (ValueError, RecursionError):
                    reply: Reply = {"error": {"code": "invalid_arguments", "message": "not JSON"}}
                else:
                    reply = await host.call(name, arguments)
                await deliver(call_id, reply)

            mr.eval(
                _PRELUDE % {"log_limit": limits.log_bytes, "call_limit": limits.nested_calls + 1}
            )
            try:
                try:
                    await mr.eval_cancelable(
                        "__lodger_finish((async () => {\n" + source + "\n})())"
                    )
                    while True:
                        moved.clear()
                        calls, done, over = _taken(await mr.eval_cancelable("__lodger_take()"))
                        if mr.was_hard_memory_limit_reached():
                            return _memory(limits)
                        if over:
                            # the prelude refused calls past the budget: the cell is over it,
                            # whether or not the cell waited for those refusals
                            host.exceeded = "nested_calls"
                            host.stop(
                                "limit_exceeded",
                                f"the cell made more than {limits.nested_calls} nested calls",
                            )
                        for call_id, name, text in calls:
                            host.spawn(work(call_id, name, text))
                        if done is not None:
                            result = done
                            break
                        await moved.wait()
                finally:
                    finished = True
            except JSParseException as exc:
                return CellOutcome(
                    diagnostic=Diagnostic(kind="parse_error", message=_parse_message(exc))
                )
            except JSOOMException:
                return _memory(limits)
            except JSEvalException as exc:
                if mr.was_hard_memory_limit_reached():
                    return _memory(limits)
                return CellOutcome(
                    diagnostic=Diagnostic(kind="runtime_error", message=str(exc)[:2000])
                )
            except _Unreadable as exc:
                return CellOutcome(diagnostic=Diagnostic(kind="runtime_error", message=str(exc)))
            finally:
                # Nested calls the cell did not wait for end before the isolate goes.
                await host.settle(cancel=True)
            if mr.was_hard_memory_limit_reached():
                return _memory(limits)
        return _outcome(result, limits, source.count("\n") + 1)


_TAMPERED = (
    "the cell replaced objects the runtime relies on (JSON, a prototype); its calls and "
    "result could not be read"
)


def _taken(text: Any) -> tuple[list[tuple[int, str, str]], str | None, int]:
    """The calls the cell queued, its result text once settled, and how many calls the
    prelude refused past the budget; ``_Unreadable`` when the text is not in the
    prelude's shape."""
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise _Unreadable(_TAMPERED)
    calls, done, over = data.get("calls"), data.get("done"), data.get("over")
    if (
        not isinstance(calls, list)
        or not (done is None or isinstance(done, str))
        or type(over) is not int
    ):
        raise _Unreadable(_TAMPERED)
    out: list[tuple[int, str, str]] = []
    for item in calls:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and type(item[0]) is int
            and isinstance(item[1], str)
            and isinstance(item[2], str)
        ):
            raise _Unreadable(_TAMPERED)
        out.append((item[0], item[1], item[2]))
    return out, done, over


def _memory(limits: CellLimits) -> CellOutcome:
    return CellOutcome(
        diagnostic=Diagnostic(
            kind="limit_exceeded",
            limit="memory",
            message=f"the cell used more than {limits.memory} bytes of memory",
        )
    )


def _parse_message(exc: JSParseException) -> str:
    # "<anonymous>:3: SyntaxError: ..." — line 1 is the wrapper, so cell lines are one less
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
    if first.startswith("<anonymous>:"):
        where, _, rest = first[len("<anonymous>:") :].partition(":")
        if where.isdigit():
            return f"line {int(where) - 1}:{rest}"
    if first.startswith("undefined:0: "):  # the parser ran out of stack: no line to name
        return first[len("undefined:0: ") :]
    return first


def _outcome(text: str, limits: CellLimits, cell_lines: int) -> CellOutcome:
    if len(text.encode("utf-8", "replace")) > limits.result_bytes + limits.log_bytes + 64:
        return CellOutcome(
            diagnostic=Diagnostic(
                kind="limit_exceeded",
                limit="result_bytes",
                message=f"the cell's result is larger than {limits.result_bytes} bytes",
            )
        )
    try:
        data = json.loads(text)
    except RecursionError:
        return CellOutcome(
            diagnostic=Diagnostic(
                kind="result_not_json",
                message="the cell's result is nested too deeply to be read as JSON",
            )
        )
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("logs", []), list):
        return CellOutcome(diagnostic=Diagnostic(kind="runtime_error", message=_TAMPERED))
    logs = tuple(str(line) for line in data.get("logs", ()))
    dropped = data.get("dropped", 0)
    dropped = dropped if type(dropped) is int else 0
    if "ok" in data:
        return CellOutcome(value=data["ok"], logs=logs, logs_dropped=dropped)
    error = data.get("error")
    if not isinstance(error, dict):
        return CellOutcome(diagnostic=Diagnostic(kind="runtime_error", message=_TAMPERED))
    code = error.get("code")
    kind = "runtime_error"
    if code == "result_not_json":
        kind = "result_not_json"
    return CellOutcome(
        diagnostic=Diagnostic(
            kind=kind,
            message=f"{error.get('name', 'Error')}: {error.get('message', '')}",
            stack=_cell_stack(str(error.get("stack") or ""), cell_lines),
        ),
        logs=logs,
        logs_dropped=dropped,
    )


def _cell_stack(stack: str, cell_lines: int) -> str | None:
    """The stack with cell line numbers (the wrapper adds one line) and no frames of the
    prelude, the wrapper's first and last lines or the host's own evaluations."""
    out: list[str] = []
    for line in stack.splitlines()[1:]:
        line = line.strip()
        if "__lodger_" in line:
            continue
        frame, number = _renumber(line)
        if number is not None and not 1 <= number <= cell_lines:
            continue
        out.append(frame)
    return "\n".join(out) or None


def _renumber(frame: str) -> tuple[str, int | None]:
    marker = "<anonymous>:"
    at = frame.find(marker)
    if at < 0:
        return frame, None
    rest = frame[at + len(marker) :]
    line, _, tail = rest.partition(":")
    if not line.isdigit():
        return frame, None
    return f"{frame[:at]}cell:{int(line) - 1}:{tail}", int(line) - 1
