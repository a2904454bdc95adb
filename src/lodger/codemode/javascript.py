"""JavaScript cells in a fresh V8 isolate (mini-racer).

Each cell gets its own isolate with a hard heap limit and nothing of the host in reach:
no filesystem, network, process, imports, timers, shared memory or WebAssembly, and a
clock frozen at the epoch (``Date.now()`` is 0), so there is no clock to time a side
channel with and nothing outlives the cell. ``await tools.NAME(args)`` returns the parsed
result or throws a ``ToolError`` with a ``code``.

How values cross: a call is a notification out (id, name, JSON text); the reply comes back
in by a cancellable evaluation of ``__lodger_deliver(id, text)``. Two things this avoids:
resolving a JS promise from Python is an uncancellable call that would block the event
loop if the cell then looped forever; and a Python exception raised into JS would carry
its traceback and host paths. Only JSON text written by ``CellHost`` crosses.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from py_mini_racer import (
    JSEvalException,
    JSFunction,
    JSOOMException,
    JSParseException,
    mini_racer,
)

from lodger.codemode._host import CellHost, Reply
from lodger.codemode.limits import CellLimits
from lodger.codemode.substrate import CellOutcome, Diagnostic

__all__ = ["JavaScriptSubstrate"]

_PRELUDE = """
(() => {
  const notify = globalThis.__lodger_notify;
  delete globalThis.__lodger_notify;
  const pending = new Map();
  let next = 0;
  const logs = [];
  let logBytes = 0, dropped = 0;
  const LOG_LIMIT = %(log_limit)d;
  const show = (v) => {
    if (typeof v === 'string') return v;
    try { const s = JSON.stringify(v); return s === undefined ? String(v) : s; }
    catch (e) { return String(v); }
  };
  const log = (...args) => {
    const line = args.map(show).join(' ');
    if (logBytes + line.length + 1 > LOG_LIMIT) { dropped++; return; }
    logBytes += line.length + 1;
    logs.push(line);
  };
  globalThis.console = Object.freeze({log, info: log, warn: log, error: log, debug: log});
  class ToolError extends Error {
    constructor(code, message) { super(message); this.name = 'ToolError'; this.code = code; }
  }
  globalThis.ToolError = ToolError;
  const call = (name, args) => new Promise((resolve, reject) => {
    let text;
    try { text = JSON.stringify(args === undefined ? {} : args); }
    catch (e) {
      reject(new ToolError('invalid_arguments', 'arguments are not JSON: ' + e.message));
      return;
    }
    const id = next++;
    pending.set(id, {resolve, reject});
    notify(id, name, text === undefined ? 'null' : text);
  });
  Object.defineProperty(globalThis, '__lodger_deliver', {value: (id, text) => {
    const waiter = pending.get(id);
    if (!waiter) return;
    pending.delete(id);
    const reply = JSON.parse(text);
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
  Object.defineProperty(globalThis, '__lodger_finish', {value: (promise) => promise.then(
    (v) => {
      try { return JSON.stringify({ok: v === undefined ? null : v, logs, dropped}); }
      catch (e) {
        return JSON.stringify({error: {name: 'TypeError', code: 'result_not_json',
          message: 'the cell returned a value that is not JSON: ' + e.message, stack: ''},
          logs, dropped});
      }
    },
    (e) => JSON.stringify({error: failed(e), logs, dropped}),
  )});
  for (const name of ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval',
      'SharedArrayBuffer', 'Atomics', 'WebAssembly', 'performance', '__TimerManager',
      '__timer_manager', 'Realm', 'os', 'd8']) {
    try { delete globalThis[name]; } catch (e) { /* not configurable */ }
    if (name in globalThis) globalThis[name] = undefined;  // declared with var: unset
  }
  const RealDate = Date;
  globalThis.Date = class Date extends RealDate {
    constructor(...a) { if (a.length === 0) super(0); else super(...a); }
    static now() { return 0; }
  };
})();
"""


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

            async def work(call_id: int, name: str, text: str) -> None:
                try:
                    arguments: Any = json.loads(text)
                except ValueError:
                    reply: Reply = {"error": {"code": "invalid_arguments", "message": "not JSON"}}
                else:
                    reply = await host.call(name, arguments)
                await deliver(call_id, reply)

            async def notify(call_id: Any, name: Any, text: Any) -> None:
                host.spawn(work(int(call_id), str(name), str(text)))

            async with mr.wrap_py_function(notify) as fn:
                install = cast(
                    "JSFunction",
                    mr.eval("(f) => { globalThis.__lodger_notify = (...a) => { f(...a); }; }"),
                )
                install(fn)
                mr.eval(_PRELUDE % {"log_limit": limits.log_bytes})
                try:
                    try:
                        promise = await mr.eval_cancelable(
                            "__lodger_finish((async () => {\n" + source + "\n})())"
                        )
                        text = await promise  # type: ignore[misc]
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
                finally:
                    # Nested calls the cell did not wait for end before the isolate goes.
                    await host.settle(cancel=True)
                if mr.was_hard_memory_limit_reached():
                    return _memory(limits)
        return _outcome(str(text), limits)


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
    return first


def _outcome(text: str, limits: CellLimits) -> CellOutcome:
    if len(text.encode("utf-8", "replace")) > limits.result_bytes + limits.log_bytes + 64:
        return CellOutcome(
            diagnostic=Diagnostic(
                kind="limit_exceeded",
                limit="result_bytes",
                message=f"the cell's result is larger than {limits.result_bytes} bytes",
            )
        )
    data = json.loads(text)
    logs = tuple(str(line) for line in data.get("logs", ()))
    dropped = int(data.get("dropped", 0))
    if "ok" in data:
        return CellOutcome(value=data["ok"], logs=logs, logs_dropped=dropped)
    error = data["error"]
    code = error.get("code")
    kind = "runtime_error"
    if code == "result_not_json":
        kind = "result_not_json"
    return CellOutcome(
        diagnostic=Diagnostic(
            kind=kind,
            message=f"{error.get('name', 'Error')}: {error.get('message', '')}",
            stack=_cell_stack(str(error.get("stack") or "")),
        ),
        logs=logs,
        logs_dropped=dropped,
    )


def _cell_stack(stack: str) -> str | None:
    """The stack with cell line numbers (the wrapper adds one line) and no wrapper frames."""
    out: list[str] = []
    for line in stack.splitlines()[1:]:
        line = line.strip()
        if "__lodger_" in line:
            continue
        out.append(_renumber(line))
    return "\n".join(out) or None


def _renumber(frame: str) -> str:
    marker = "<anonymous>:"
    at = frame.find(marker)
    if at < 0:
        return frame
    rest = frame[at + len(marker) :]
    line, _, tail = rest.partition(":")
    if not line.isdigit():
        return frame
    return f"{frame[:at]}cell:{int(line) - 1}:{tail}"
