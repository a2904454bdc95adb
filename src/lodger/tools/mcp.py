"""MCP servers as bound tools, over stdio or streamable HTTP, with the official SDK.

    async with McpServers([McpServerConfig(name="git", command="mcp-server-git")]) as mcp:
        agent = Agent(model=model, tools=[*workspace_tools(), *mcp.tools()])

Each server's tools are bound as ``<server>__<tool>`` (characters outside ``A-Za-z0-9_-``
become ``_``; a name over 64 characters is cut and ends in a hash of the whole), in the
server's group, deferred unless the server's config says otherwise, and asking for
approval as configured per server or per tool. Their input schemas are taken as given
and validated by the call path like any tool's. A tool whose input schema lodger cannot
validate against (not a JSON schema, or a ``$ref`` that resolves nowhere: lodger never
fetches one) is still bound, so the model can find it and learn why, but with an empty
object schema, a description that says so, and calls that fail with that reason; a
warning is logged and ``McpServers.unusable()`` lists it.

Failures are results, never crashes of the turn: an ``isError`` result is an error
result; a call that does not answer within the server's ``timeout_s`` is an error result
(the server stays connected); a call in flight when the server exits or drops the
connection is an error result that says so, with the last line it wrote to stderr (it
may or may not have taken effect), and the next call of its tools starts the server
again (or reconnects over HTTP); a server that cannot be brought back makes that call an
error result. A server that exits while idle is noticed when its end of the connection
closes, so the next call does not fail on it. Each connection lives in its own task,
owned by ``McpServers``: the SDK runs its transport in a task group that fails the task
hosting it when the transport fails, and that must never be the agent's task. Leaving
the ``async with`` stops every server (stdin closed, then SIGTERM, then SIGKILL, as the
SDK does) and awaits every task.

A server cannot flood lodger. Its messages are bounded before they are parsed
(``_mcp_stdio``, ``_mcp_http``): lodger reads at most ``max_message_bytes`` (default
4 MiB, per server) of one message; a longer one is never parsed and costs about the limit
in buffers; the request it answered gets an error result naming the limit (a listing
that long stops the start with one line). Memory bound: a message within the limit takes
at most about 30 times its size while it is parsed (Python's objects for a message of
empty JSON objects, the worst case; a text result about 3 times), so at most about
130 MB per message in flight with the default, and a listing is cut to 2001 tools before
the SDK builds a model of each (``_mcp_streams``). What a server sends that is not
protocol (lines on stdout that are not JSON-RPC, messages over the limit, whatever makes
the SDK log a warning) is counted and reported as one line per server when the block
ends (``_mcp_limits``). A tool whose definition the SDK would refuse (an input schema
that is not an object) is bound unusable with the reason; the server's other tools bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast

from pydantic import ValidationError

from lodger._core.extras import require
from lodger._core.text import visible_text
from lodger.authority import ResourceClaim
from lodger.errors import ConfigError, ToolCallError
from lodger.events import canonical_json
from lodger.tools._mcp_limits import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MESSAGE_TOO_LARGE,
    Noise,
    capture_sdk_logs,
    counting,
)
from lodger.tools._mcp_oauth import NEEDS_LOGIN, McpOAuth
from lodger.tools.spec import Tool, ToolContext, ToolOutput

# The SDK takes about 0.3 s to import: it is imported where a server starts or answers,
# so commands that bind no MCP server do not pay for it.
if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

    from lodger.tools._mcp_streams import Listing, Parsed

__all__ = [
    "McpOAuth",
    "McpServerConfig",
    "McpServers",
    "mcp_tool_name",
    "tools_from_definitions",
]

_log = logging.getLogger(__name__)

_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64  # what OpenAI and Anthropic accept for a tool name
MAX_STDERR_BYTES = 1024 * 1024  # of a server's stderr kept on disk, checked every second
MIN_MESSAGE_BYTES = 1024  # of max_message_bytes: a handshake takes a few hundred
_TRIM_EVERY_S = 1.0


@dataclass(frozen=True, kw_only=True)
class McpServerConfig:
    """One MCP server: ``command`` (+ ``args``, ``env``, ``cwd``) for stdio, or ``url``
    (+ ``headers``, and ``auth`` for an OAuth login: ``lodger.tools._mcp_oauth``) for
    streamable HTTP. ``approval`` is True (every tool asks), False, or tool-name patterns
    that ask (``["git_commit", "git_reset*"]``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    deferred: bool = True
    approval: bool | tuple[str, ...] = False
    timeout_s: float = 60.0
    connect_timeout_s: float = 30.0
    #: the largest message of the server lodger reads (``lodger.tools._mcp_limits``)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: OAuth 2.1 for an HTTP server: its login comes from a credential store
    auth: McpOAuth | None = None

    def __post_init__(self) -> None:
        if not _SERVER_NAME.match(self.name) or "__" in self.name:
            raise ConfigError(
                f"MCP server name {self.name!r} is not usable",
                hint="use 1-32 letters, digits, '-' or '_' (no '__'); it prefixes tool names",
            )
        if (self.command is None) == (self.url is None):
            raise ConfigError(
                f"MCP server {self.name!r} needs exactly one of command (stdio) or url (HTTP)",
                hint='e.g. command = "mcp-server-time" or url = "http://127.0.0.1:8000/mcp"',
            )
        # not (t > 0): NaN too (TOML has nan), which no comparison rejects
        if not (self.timeout_s > 0 and self.connect_timeout_s > 0):
            raise ConfigError(f"MCP server {self.name!r}: timeouts must be positive")
        if self.auth is not None and self.url is None:
            raise ConfigError(f"MCP server {self.name!r}: OAuth is for HTTP servers (a url)")
        if self.auth is not None and any(h.lower() == "authorization" for h in self.headers):
            raise ConfigError(
                f"MCP server {self.name!r} has both OAuth and an Authorization header",
                hint="drop one of them",
            )
        size = self.max_message_bytes
        if type(size) is not int or size < MIN_MESSAGE_BYTES:
            raise ConfigError(
                f"MCP server {self.name!r}: max_message_bytes must be a whole number of at "
                f"least {MIN_MESSAGE_BYTES} bytes",
                hint=f"the default is {DEFAULT_MAX_MESSAGE_BYTES} (4 MiB)",
            )

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def asks(self, tool: str) -> bool:
        if isinstance(self.approval, bool):
            return self.approval
        return any(fnmatchcase(tool, pattern) for pattern in self.approval)


def mcp_tool_name(server: str, tool: str) -> str:
    """The bound name of ``tool`` of ``server``: ``<server>__<tool>``, provider-safe."""
    name = _UNSAFE.sub("_", f"{server}__{tool}")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{server}__{tool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


# ---------------------------------------------------------------- results


def _block_text(block: Any) -> str:
    import mcp_types

    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
        return f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link {block.uri}" + (f" ({block.name})]" if block.name else "]")
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri}: {resource.mime_type or 'binary'} data, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def result_output(result: mcp_types.CallToolResult) -> ToolOutput:
    """An MCP result as a lodger result: text blocks joined, other blocks described."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = visible_text("\n".join(parts))  # a JSON \udXXX escape may decode to a lone surrogate
    if result.is_error:
        return ToolOutput(
            content=text or "the tool reported an error without a message", is_error=True
        )
    return ToolOutput(content=text)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """Why a server failed, on one line of at most about 500 characters: it may quote the
    server or the SDK's validation (a page of lines, or a megabyte), and it goes into a
    ConfigError and ``failures()``."""
    lines = _why(exc).strip().splitlines() or [""]
    why = lines[0] if len(lines) == 1 else f"{lines[0]} ({len(lines) - 1} more lines cut)"
    if len(why) <= 500:
        return why
    return f"{why[:500]}... ({len(why) - 500} more characters cut)"


def _why(exc: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return leaf.message
    if isinstance(leaf, ValidationError):  # one line, not pydantic's page of them
        first = leaf.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return (
            f"it answered with something that is not valid MCP ({leaf.error_count()} "
            f"problems; the first at {where}: {first['msg']})"
        )
    if isinstance(leaf, TimeoutError):
        return "it did not finish connecting in time"
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__


# ---------------------------------------------------------------- one connection


class _Connection:
    """One server, driven by ``run`` in a task of its own (see the module docstring)."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.listed: list[mcp_types.Tool] = []
        self.failure: str | None = None
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._down = asyncio.Event()
        self._stop = asyncio.Event()  # ends the current run
        self._closed = False  # the McpServers block ended: never reconnect
        self._reconnecting = asyncio.Lock()
        self._stderr: TextIO | None = None
        # Starts ``run`` again in the owner's task group (set by McpServers).
        self.spawn: Callable[[], None] | None = None
        self.reconnects = 0
        self.noise = Noise()  # what the server sent that was not protocol, in every run
        self.listing: Listing | None = None  # the current run's
        self._parsed: Parsed | None = None  # the current run's, over HTTP

    async def _transport(self, stack: AsyncExitStack) -> Any:
        from mcp.client.streamable_http import streamable_http_client

        from lodger.tools._mcp_http import SSE_BACKSTOP, bounded_http_client
        from lodger.tools._mcp_stdio import bounded_stdio

        c = self.config
        if c.command is not None:
            assert self._stderr is not None
            return bounded_stdio(
                server=c.name,
                command=c.command,
                args=list(c.args),
                env=dict(c.env) or None,
                cwd=c.cwd,
                errlog=self._stderr,
                limit=c.max_message_bytes,
                noise=self.noise,
            )
        assert c.url is not None
        assert self._parsed is not None
        http = await stack.enter_async_context(
            bounded_http_client(
                server=c.name,
                headers=c.headers,
                auth=_bearer(c),
                limit=c.max_message_bytes,
                noise=self.noise,
                parsed=self._parsed,
            )
        )
        return streamable_http_client(
            c.url, http_client=http, max_sse_event_size=c.max_message_bytes + SSE_BACKSTOP
        )

    async def run(self) -> None:
        """Connect, list the tools, serve calls until stopped or the server goes away;
        record why it ended."""
        with counting(self.noise):  # the SDK's warnings in this run are the server's noise
            await self._run()

    async def _run(self) -> None:
        from mcp import Client

        from lodger.tools._mcp_streams import Listing, Parsed, watched

        c = self.config
        stop = self._stop  # this run's: a reconnect gives the next run its own
        lost: list[bool] = []

        def ended() -> None:  # the server closed its end: it exited or dropped us
            lost.append(True)
            stop.set()

        if c.command is not None:
            # The server's stderr, kept to explain a failure (a real file: it is a pipe end).
            self._stderr = cast(TextIO, await asyncio.to_thread(tempfile.TemporaryFile, "w+"))
        try:
            async with AsyncExitStack() as stack:
                async with asyncio.timeout(c.connect_timeout_s):
                    self.listing = listing = Listing(keep=MAX_TOOLS_PER_SERVER + 1)
                    self._parsed = parsed = Parsed() if c.url is not None else None
                    transport = watched(await self._transport(stack), ended, listing, parsed)
                    client = await stack.enter_async_context(
                        Client(transport, client_info=_client_info())
                    )
                    self.listed = await _list_tools(client, c.name, listing)
                self._client = client
                self._ready.set()
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), _TRIM_EVERY_S)
                    await asyncio.to_thread(self._trim_stderr)
                self._client = None
            if lost and not self._closed:
                self.failure = await self._explain("it exited or closed its connection")
        except Exception as exc:  # noqa: BLE001 - any transport failure ends this server only
            self.failure = await self._explain(_describe(exc))
        finally:
            self._client = None
            self._down.set()
            self._ready.set()
            if self._stderr is not None:
                await asyncio.to_thread(self._stderr.close)

    async def _explain(self, why: str) -> str:
        tail = await asyncio.to_thread(self._stderr_tail)
        return f"{why} (last line on its stderr: {tail})" if tail else why

    def _trim_stderr(self) -> None:
        """Keep the server's stderr file under ``MAX_STDERR_BYTES`` (a server may write
        gigabytes there): past it, only its last 4000 bytes stay. The file offset is shared
        with the server's process, so moving it makes the server write after those."""
        if self._stderr is None or self._stderr.closed:
            return
        try:
            fd = self._stderr.fileno()
            size = os.fstat(fd).st_size
            if size <= MAX_STDERR_BYTES:
                return
            keep = os.pread(fd, 4000, size - 4000)
            os.ftruncate(fd, 0)
            os.pwrite(fd, keep, 0)
            os.lseek(fd, len(keep), os.SEEK_SET)
        except (ValueError, OSError):
            return  # closed meanwhile by the runner's own exit

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            # only the end, as bytes: a server may have written gigabytes there, or bytes
            # that are not UTF-8
            fd = self._stderr.fileno()
            size = os.fstat(fd).st_size
            text = os.pread(fd, 4000, max(0, size - 4000)).decode("utf-8", "replace")
        except (ValueError, OSError):
            # closed meanwhile by the runner's own exit (another thread): a call that
            # explains the crash must not fail on its explanation
            return ""
        lines = [line.strip() for line in text.splitlines()]
        lines = [line for line in lines if line]
        return lines[-1][:300] if lines else ""

    async def started(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        self._closed = True
        self._stop.set()

    async def _reconnect(self) -> None:
        """Start the server again after it went down, once however many calls ask."""
        async with self._reconnecting:
            if self._client is not None and self.failure is None:
                return  # another call brought it back while this one waited
            if self._closed or self.spawn is None:
                raise self._unavailable()
            self._stop.set()  # a run still waiting on a dead transport ends now
            await self._down.wait()
            why = self.failure
            self._stop, self._ready, self._down = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self.failure = None
            self.spawn()
            await self._ready.wait()
            if self.failure is not None:
                self.failure = f"it went down ({why}) and did not start again: {self.failure}"
                raise self._unavailable()
            self.reconnects += 1
            _log.warning("MCP server %r reconnected after: %s", self.config.name, why)

    def _unavailable(self) -> ToolCallError:
        if not self._closed and self.spawn is not None:
            return ToolCallError(
                f"MCP server {self.config.name!r} is not available: "
                f"{self.failure or 'it went down'}; this call may or may not have taken "
                "effect, so check before repeating it (the next call of its tools starts "
                "the server again)"
            )
        return ToolCallError(
            f"MCP server {self.config.name!r} is not available: "
            f"{self.failure or 'it is not connected (stopped with its McpServers block)'}; "
            "its tools cannot run in this session, so use other tools or tell the user"
        )

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        import anyio
        import mcp_types
        from mcp.shared.exceptions import MCPError

        if self._client is None or self.failure is not None:
            await self._reconnect()
        client, went_down = self._client, self._down
        if client is None:
            raise self._unavailable()
        timeout = self.config.timeout_s
        with counting(self.noise):  # the task copies the context: its SDK warnings count
            work = asyncio.ensure_future(
                client.call_tool(tool, arguments, read_timeout_seconds=timeout)
            )
        down = asyncio.ensure_future(went_down.wait())
        try:
            # The SDK times the call out; ours is a backstop for a wedged transport.
            await asyncio.wait(
                {work, down}, timeout=timeout + 5, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (work, down):
                task.cancel()
            await asyncio.gather(work, down, return_exceptions=True)
        if not work.done() or work.cancelled():
            if went_down.is_set():
                raise self._unavailable()
            raise self._timed_out(tool)
        try:
            answer = work.result()
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                raise self._timed_out(tool) from None
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self.failure = await self._explain("its connection closed (did it exit?)")
                raise self._unavailable() from None
            if exc.code == MESSAGE_TOO_LARGE:
                raise ToolCallError(
                    f"{mcp_tool_name(self.config.name, tool)} did not get an answer lodger "
                    f"could read: {exc.message}; the call may have taken effect"
                ) from None
            raise ToolCallError(
                f"MCP server {self.config.name!r} refused the call to {tool}: {exc.message}"
            ) from None
        except ValidationError as exc:
            raise self._invalid(tool, exc) from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            # the transport broke under the call: a server that had just exited
            self.failure = await self._explain("its connection broke (did it exit?)")
            raise self._unavailable() from None
        except ValueError as exc:
            if "closed file" not in str(exc):
                raise
            # the request went to the pipe of a server that had just exited
            self.failure = await self._explain("its connection closed (did it exit?)")
            raise self._unavailable() from None
        try:
            return result_output(answer)
        except ValidationError as exc:
            raise self._invalid(tool, exc) from None

    def _invalid(self, tool: str, exc: ValidationError) -> ToolCallError:
        return ToolCallError(
            f"MCP server {self.config.name!r} answered {tool} with an invalid result "
            f"({exc.error_count()} problems)"
        )

    def _timed_out(self, tool: str) -> ToolCallError:
        return ToolCallError(
            f"{mcp_tool_name(self.config.name, tool)} did not answer within "
            f"{self.config.timeout_s:g} s (MCP server {self.config.name!r} may be stuck or "
            "the work too slow); it may still finish, so check before repeating it"
        )


def _bearer(config: McpServerConfig) -> Any:
    """The OAuth login of an HTTP server on its requests (None: it has none)."""
    if config.auth is None or config.url is None:
        return None
    from lodger.tools._mcp_bearer import BearerAuth

    return BearerAuth(server=config.name, url=config.url, oauth=config.auth)


def _client_info() -> mcp_types.Implementation:
    import mcp_types

    return mcp_types.Implementation(name="lodger", version="0.1")


# Tools bound from one server. Checking a schema takes about a millisecond on the event
# loop, so 100 000 listed tools would stall every other task for minutes; real servers
# list tens (the 20 of the tool_search catalog: 633 in all).
MAX_TOOLS_PER_SERVER = 2000


async def _list_tools(client: Client, server: str, listing: Listing) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(1000):  # a server whose cursor never ends cannot hang us
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if len(tools) > MAX_TOOLS_PER_SERVER:
            _log.warning(
                "MCP server %r lists more than %d tools (%d so far); only the first %d are bound",
                server,
                MAX_TOOLS_PER_SERVER,
                listing.listed,
                MAX_TOOLS_PER_SERVER,
            )
            return tools[:MAX_TOOLS_PER_SERVER]
        if not cursor:
            break
    return tools


# ---------------------------------------------------------------- tools


def tools_from_definitions(
    definitions: Sequence[Mapping[str, Any]],
    *,
    config: McpServerConfig | None = None,
    connection: _Connection | None = None,
) -> list[Tool]:
    """Tools from MCP ``tools/list`` definitions (``name``, ``description``, ``inputSchema``,
    optional ``group``). Without a connection they are a catalog: searchable, not callable.
    A definition whose schema is unusable becomes a tool that says why when called."""
    return _bind(definitions, config=config, connection=connection)[0]


def _bind(
    definitions: Sequence[Mapping[str, Any]],
    *,
    config: McpServerConfig | None,
    connection: _Connection | None,
    taken: set[str] | None = None,
) -> tuple[list[Tool], dict[str, str]]:
    """The tools, and why each unusable one cannot be called, by bound name."""
    out: list[Tool] = []
    unusable: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    twice: dict[str, list[str]] = {}  # by group: names listed more than once
    taken = set() if taken is None else taken  # bound names, of every server so far
    for d in definitions:
        raw = str(d["name"])
        group = config.name if config is not None else str(d.get("group") or "catalog")
        if (group, raw) in seen:  # listed twice: the first stands, a call names it once
            twice.setdefault(group, []).append(raw)
            continue
        seen.add((group, raw))
        name = mcp_tool_name(group, raw) if config or d.get("group") else raw
        if name in taken:  # another tool's name mangles to the same: tell them apart
            name = _distinct(group, raw, taken)
        taken.add(name)
        schema = d.get("inputSchema") or {"type": "object"}
        description = _bounded(str(d.get("description") or ""))
        handler = _handler(raw, group, connection)
        reason = d.get("unusable")  # the listing was not valid MCP (``_mcp_streams``)
        if reason is None and (problem := schema_problem(schema)) is not None:
            reason = f"its input schema {problem}"
        if reason is not None:
            unusable[name] = reason
            description = f"{description}\n[lodger cannot call this tool: {reason}]".lstrip()
            schema, handler = {"type": "object"}, _refusing_handler(raw, group, reason)
        out.append(
            Tool(
                name=name,
                description=description,
                parameters=dict(schema),
                handler=handler,
                group=group,
                deferred=config.deferred if config is not None else True,
                approval=config.asks(raw) if config is not None else False,
                claims=_capacity(group) if connection is not None else None,
                # the server's own per-call limit answers first; this is the backstop
                timeout=config.timeout_s + 10 if config is not None else None,
            )
        )
    _warn_unbindable(out, unusable, twice)
    return out, unusable


def _warn_unbindable(
    tools: list[Tool], unusable: Mapping[str, str], twice: Mapping[str, list[str]]
) -> None:
    """One warning per server whose listing had tools that cannot be called, or names
    listed twice (a listing of a thousand broken tools is one line, not a thousand)."""
    groups = {t.group for t in tools if t.name in unusable} | set(twice)
    for group in sorted(g for g in groups if g is not None):
        parts = []
        broken = [t.name for t in tools if t.group == group and t.name in unusable]
        if broken:
            named = "; ".join(f"{name}: {unusable[name][:200]}" for name in broken[:3])
            more = f"; and {len(broken) - 3} more" if len(broken) > 3 else ""
            parts.append(f"{len(broken)} tools are bound but cannot be called ({named}{more})")
        if group in twice:
            names = ", ".join(repr(name[:64]) for name in twice[group][:3])
            more = f" and {len(twice[group]) - 3} more" if len(twice[group]) > 3 else ""
            parts.append(f"it lists {names}{more} twice; only the first of each is bound")
        _log.warning("MCP server %r: %s", group, "; ".join(parts))


def _distinct(group: str, raw: str, taken: set[str]) -> str:
    """A bound name for ``raw`` that no earlier tool has, when its plain one is taken
    (``a.b`` and ``a_b`` both become ``<server>__a_b``): it ends in a hash of the name."""
    base = _UNSAFE.sub("_", f"{group}__{raw}")
    for salt in range(100):
        digest = hashlib.sha256(f"{group}__{raw}#{salt}".encode()).hexdigest()[:8]
        name = f"{base[: MAX_NAME - 9]}_{digest}"
        if name not in taken:
            return name
    raise ConfigError(f"MCP tool names of {group!r} collide past telling apart ({raw!r})")


# What one MCP tool may put into every model request that shows it: a server's listing is
# not trusted to be reasonable (a 10 MB description would be sent with every step).
MAX_DESCRIPTION = 8000  # characters; the largest of 633 real tools' is under 3000
MAX_SCHEMA_BYTES = 64 * 1024  # canonical JSON; the largest real one is under 2 KB


def _bounded(description: str) -> str:
    if len(description) <= MAX_DESCRIPTION:
        return description
    return (
        f"{description[:MAX_DESCRIPTION]}\n[lodger cut this description: it has "
        f"{len(description)} characters, more than {MAX_DESCRIPTION}]"
    )


# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})
_MAX_SCHEMA_DEPTH = 100


def schema_problem(schema: object) -> str | None:
    """Why lodger cannot validate arguments against ``schema`` (as a phrase after "its input
    schema"), or None when it can: it must be a JSON object, a valid draft 2020-12 schema,
    and every ``$ref`` must resolve within it (nothing is fetched)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        return f"is a JSON {type(schema).__name__}, not an object"
    if _depth(schema) > _MAX_SCHEMA_DEPTH:  # before anything recursive walks it
        return f"is nested more than {_MAX_SCHEMA_DEPTH} levels deep"
    try:
        size = len(canonical_json(schema))  # what a step records as the tool's schema digest
    except (ValueError, UnicodeEncodeError):
        return "holds values that are not JSON (NaN, infinities or invalid Unicode)"
    if size > MAX_SCHEMA_BYTES:  # it would be sent with every step that shows the tool
        return f"is {size} bytes of JSON, more than {MAX_SCHEMA_BYTES}"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        at = f" at {where!r}" if where else ""
        return f"is not a valid JSON schema ({visible_text(exc.message)}{at})"
    return _unresolvable_ref(schema)


def _depth(value: object) -> int:
    depth, level = 0, [value]
    while level and depth <= _MAX_SCHEMA_DEPTH:
        depth += 1
        nested: list[object] = []
        for item in level:
            if isinstance(item, dict):
                nested.extend(item.values())
            elif isinstance(item, list):
                nested.extend(item)
        level = nested
    return depth


def _unresolvable_ref(schema: dict[str, Any]) -> str | None:
    from jsonschema_specifications import REGISTRY as METASCHEMAS
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(schema)
    registry = METASCHEMAS.with_resource(root.id() or "", root).crawl()
    stack: list[tuple[object, Any]] = [(schema, registry.resolver(root.id() or ""))]
    while stack:
        node, resolver = stack.pop()
        if isinstance(node, list):
            stack.extend((item, resolver) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    return f"has a {keyword} {visible_text(ref)!r} that resolves to nothing"
        stack.extend((value, resolver) for key, value in node.items() if key not in _DATA_KEYWORDS)
    return None


def _capacity(server: str) -> Any:
    """One unit of ``mcp:<server>``: unlimited unless the authorities set a limit."""
    claim = ResourceClaim.capacity(f"mcp:{server}")

    def claims(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        return [claim]

    return claims


def _handler(raw: str, group: str, connection: _Connection | None) -> Any:
    async def handle(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if connection is None:
            raise ToolCallError(f"{raw} is a catalog entry of {group!r}; no server runs it")
        return await connection.call(raw, arguments)

    return handle


def _refusing_handler(raw: str, group: str, reason: str) -> Any:
    async def refuse(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise ToolCallError(
            f"{mcp_tool_name(group, raw)} (of MCP server {group!r}) cannot be called: "
            f"{reason}, so lodger cannot check arguments for it",
            hint="use another tool, or tell the user that the server's schema needs fixing",
            code="unusable_tool",
        )

    return refuse


class McpServers:
    """Connects to MCP servers for the life of an ``async with`` block.

    Entering starts every server concurrently and lists their tools; a server that cannot
    start raises ``ConfigError`` naming it (after stopping the others). Inside, ``tools()``
    are the bound tools and ``failures()`` says which servers went down since.
    """

    def __init__(self, configs: Sequence[McpServerConfig]) -> None:
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"two MCP servers share a name in {names}")
        self._connections = [_Connection(c) for c in configs]
        self._group: asyncio.TaskGroup | None = None
        self._logs = ExitStack()
        self._tools: list[Tool] = []
        self._unusable: dict[str, str] = {}

    async def __aenter__(self) -> McpServers:
        if self._connections:
            with require("mcp", "the MCP client (MCP servers as tools)"):
                importlib.import_module("mcp")
        self._logs.enter_context(capture_sdk_logs())
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        for connection in self._connections:
            connection.spawn = self._spawner(connection)
            connection.spawn()
        try:
            for connection in self._connections:
                await connection.started()
            failed = [c for c in self._connections if c.failure is not None]
            if failed:
                first = failed[0]
                login = NEEDS_LOGIN in (first.failure or "")  # the message says how to log in
                raise ConfigError(
                    f"MCP server {first.config.name!r} did not start: {first.failure}",
                    hint=None if login else "check its command or url in lodger.toml or --mcp",
                )
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        taken: set[str] = set()  # "a" + "_x" and "a_" + "x" both mangle to a___x
        for connection in self._connections:
            mended = connection.listing.unusable if connection.listing is not None else {}
            definitions = [
                {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                    "unusable": mended.get(t.name),
                }
                for t in connection.listed
            ]
            tools, unusable = _bind(
                definitions, config=connection.config, connection=connection, taken=taken
            )
            if connection.listing is not None and connection.listing.unnamed:
                _log.warning(
                    "MCP server %r lists %d tools without a usable name; they are left out",
                    connection.config.name,
                    connection.listing.unnamed,
                )
            self._tools.extend(tools)
            self._unusable.update(unusable)
        return self

    def _spawner(self, connection: _Connection) -> Callable[[], None]:
        def spawn() -> None:
            if self._group is None:
                raise RuntimeError("MCP servers are used outside their async with block")
            self._group.create_task(connection.run(), name=f"mcp:{connection.config.name}")

        return spawn

    async def __aexit__(self, *exc: object) -> None:
        for connection in self._connections:
            connection.stop()
        group, self._group = self._group, None
        try:
            if group is not None:
                await group.__aexit__(None, None, None)
        finally:
            self._logs.close()
            for connection in self._connections:
                self._report(connection)

    @staticmethod
    def _report(connection: _Connection) -> None:
        """One line for what the server sent that was not protocol, once, at the end."""
        c = connection.config
        line = connection.noise.describe(c.name, c.max_message_bytes)
        if line is not None:
            _log.warning("%s", line)

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def failures(self) -> dict[str, str]:
        """Servers that are down now, with why (the next call of one of their tools tries
        to bring it back)."""
        return {c.config.name: c.failure for c in self._connections if c.failure is not None}

    async def wait_down(self, name: str) -> str:
        """Wait until server ``name`` is down (exited, hung up, or failed to start again),
        and say why."""
        (connection,) = [c for c in self._connections if c.config.name == name]
        while True:
            down = connection._down
            await down.wait()
            if connection._down is down and connection.failure is not None:
                return connection.failure
            await asyncio.sleep(0)  # a reconnect replaced the event: wait on the new one

    def reconnects(self) -> dict[str, int]:
        """How many times each server was brought back after going down."""
        return {c.config.name: c.reconnects for c in self._connections}

    def unusable(self) -> dict[str, str]:
        """Bound tools that cannot be called (their input schema is broken), with why."""
        return dict(self._unusable)
