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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast

from pydantic import ValidationError

from lodger._core.extras import require
from lodger._core.text import visible_text
from lodger.authority import ResourceClaim
from lodger.errors import ConfigError, ToolCallError, UsageError
from lodger.events import canonical_json
from lodger.media import UserInput
from lodger.tools._mcp_content import (
    McpInput,
    PromptRef,
    ResourceRef,
    _listing,
    expand,
    prompt_text,
    resource_text,
    resource_tools,
    unavailable,
)
from lodger.tools._mcp_limits import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MESSAGE_TOO_LARGE,
    Noise,
    capture_sdk_logs,
    counting,
)
from lodger.tools._mcp_oauth import NEEDS_LOGIN, McpOAuth
from lodger.tools._mcp_requests import InFlight, ServerRequests
from lodger.tools.registry import ToolsReplaced
from lodger.tools.spec import Tool, ToolContext, ToolOutput

# The SDK takes about 0.3 s to import: it is imported where a server starts or answers,
# so commands that bind no MCP server do not pay for it.
if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

    from lodger.tools._mcp_streams import Listing, Parsed

__all__ = [
    "McpInput",
    "McpOAuth",
    "McpServerConfig",
    "McpServers",
    "PromptRef",
    "ResourceRef",
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
    #: the server's questions to the user (``lodger.tools._mcp_requests``): ``ask`` whoever
    #: can answer in the run (declined where nobody can), or ``decline`` them all
    elicitation: Literal["ask", "decline"] = "ask"
    elicitation_timeout_s: float = 600.0
    #: the server's requests for a model completion: ``deny``, or ``allow`` (the session's
    #: own model answers, at most ``max_samplings`` times per call, counted in budgets)
    sampling: Literal["deny", "allow"] = "deny"
    max_samplings: int = 5
    sampling_max_tokens: int = 1024
    #: offer the workspace to the server as its root (``roots/list``)
    roots: bool = False
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
        if not (
            self.timeout_s > 0 and self.connect_timeout_s > 0 and self.elicitation_timeout_s > 0
        ):
            raise ConfigError(f"MCP server {self.name!r}: timeouts must be positive")
        self._check_asks()
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

    def _check_asks(self) -> None:
        if self.elicitation not in ("ask", "decline"):
            raise ConfigError(f'MCP server {self.name!r}: elicitation must be "ask" or "decline"')
        if self.sampling not in ("deny", "allow"):
            raise ConfigError(f'MCP server {self.name!r}: sampling must be "deny" or "allow"')
        for key in ("max_samplings", "sampling_max_tokens"):
            value = getattr(self, key)
            if type(value) is not int or value < 0:
                raise ConfigError(f"MCP server {self.name!r}: {key} must be a whole number >= 0")

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

    def __init__(self, config: McpServerConfig, workspace: Path | None = None) -> None:
        self.config = config
        self.inflight = InFlight()
        self.requests = ServerRequests(config, self.inflight, workspace)
        #: a ``notifications/tools/list_changed`` came since the listing was last read
        self.tools_stale = False
        #: resources the server said were updated since they were last noted
        self.updated: list[str] = []
        #: whether the server lists a resource or a resource template (not only the
        #: capability: an SDK server declares it with nothing to read)
        self.resources = False
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
                    client = await stack.enter_async_context(self._client_for(transport))
                    self.listed = await _list_tools(client, c.name, listing)
                    self.resources = await _offers_resources(client)
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

    def _client_for(self, transport: Any) -> Client:
        from mcp import Client

        r = self.requests
        return Client(
            transport,
            client_info=_client_info(),
            elicitation_callback=r.elicit,
            sampling_callback=r.sample,
            list_roots_callback=r.roots if self.config.roots else None,
            message_handler=self._notified,
            cache=None,  # a listing is read again on list_changed, never from a cache
        )

    async def _notified(self, message: Any) -> None:
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.tools_stale = True
        elif isinstance(message, mcp_types.ResourceUpdatedNotification):
            uri = message.params.uri
            if uri not in self.updated and len(self.updated) < 100:
                self.updated.append(uri)

    async def relist(self) -> list[mcp_types.Tool] | None:
        """The server's tools listed again after a ``list_changed`` (None: not connected)."""
        client = self._client
        if client is None or self.listing is None:
            return None
        self.tools_stale = False
        self.listed = await _list_tools(client, self.config.name, self.listing)
        return self.listed

    async def connected(self) -> Client:
        """The client, starting the server again first if it went down."""
        if self._client is None or self.failure is not None:
            await self._reconnect()
        if self._client is None:
            raise self._unavailable()
        return self._client

    def offers(self) -> tuple[bool, bool]:
        """Whether the server offers resources, and subscriptions to them."""
        client = self._client
        if client is None or not self.resources:
            return False, False
        resources = client.server_capabilities.resources
        return resources is not None, bool(resources is not None and resources.subscribe)

    async def _asked(self, what: str, work: Any) -> Any:
        """``work`` (a coroutine on the client), with the server's timeout and its
        failures as a ``ToolCallError`` that names ``what``."""
        from mcp.shared.exceptions import MCPError

        # In a task of its own, as a call is: the SDK's cancel scopes belong to the task
        # they were entered in, and the tool's task may be cancelled from outside.
        with counting(self.noise):
            task = asyncio.ensure_future(work)
        try:
            return await asyncio.wait_for(task, self.config.timeout_s)
        except MCPError as exc:
            raise unavailable(self.config.name, what, exc.message) from None
        except TimeoutError:
            raise unavailable(self.config.name, what, "it did not answer in time") from None
        except ValidationError as exc:
            raise unavailable(self.config.name, what, _describe(exc)) from None

    async def resources_listing(self) -> str:
        client = await self.connected()
        listing: str = await self._asked("list its resources", _listing(client))
        return listing

    async def read_resource(self, uri: str) -> str:
        client = await self.connected()
        result = await self._asked(f"read {uri!r}", client.read_resource(uri))
        if uri in self.updated:
            self.updated.remove(uri)  # read again: the update is seen
        return resource_text(result, uri)

    async def subscribe(self, uri: str) -> None:
        import mcp_types

        client = await self.connected()
        # the request itself: the SDK's helper warns that the 2026 protocol dropped it,
        # but the servers that offer subscriptions are of the handshake era
        request = mcp_types.SubscribeRequest(params=mcp_types.SubscribeRequestParams(uri=uri))
        work = client.session.send_request(request, mcp_types.EmptyResult)
        await self._asked(f"subscribe to {uri!r}", work)

    async def prompt(self, name: str, arguments: dict[str, str]) -> str:
        client = await self.connected()
        result = await self._asked(f"give its prompt {name!r}", client.get_prompt(name, arguments))
        return prompt_text(result, _block_text)

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
            for attempt, pause in enumerate((0.0, *RECONNECT_BACKOFF_S)):
                await asyncio.sleep(pause)  # a server that just crashed may need a moment
                self._stop, self._ready, self._down = (
                    asyncio.Event(),
                    asyncio.Event(),
                    asyncio.Event(),
                )
                self.failure = None
                self.spawn()
                await self._ready.wait()
                if self.failure is None:
                    break
                _log.warning(
                    "MCP server %r did not start again (attempt %d): %s",
                    self.config.name, attempt + 1, self.failure,
                )  # fmt: skip
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

    async def call(
        self, tool: str, arguments: dict[str, Any], ctx: ToolContext | None = None
    ) -> ToolOutput:
        if self._client is None or self.failure is not None:
            await self._reconnect()
        with contextlib.ExitStack() as stack:
            if ctx is not None:  # the server's requests meanwhile are this call's
                stack.enter_context(self.inflight.call(ctx))
            try:
                return await self._call(tool, arguments)
            except _UrlRequired as required:
                # the error path of URL elicitation: the person is sent to each URL, the
                # model reads that (never the URL) and may call the tool again
                return await self._urls_asked(tool, required.data)
            except _SessionEnded:
                # The HTTP server forgot the session (it restarted, or dropped it): the
                # request was refused before any tool ran, so it is sent once more over a
                # new session.
                self.failure = "its HTTP session ended"
                await self._reconnect()
                try:
                    return await self._call(tool, arguments)
                except _SessionEnded:
                    raise self._unavailable() from None

    async def _call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        import anyio
        import mcp_types
        from mcp.shared.exceptions import MCPError

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
            if exc.code == mcp_types.INVALID_REQUEST and exc.message == "Session terminated":
                raise _SessionEnded from None
            if exc.code == mcp_types.URL_ELICITATION_REQUIRED:
                raise _UrlRequired(exc.error.data) from None
            if self.config.url is not None and exc.message == _HTTP_ERROR_STATUS:
                # an error status with no JSON-RPC answer (a server that forgot the session
                # and says 400, a proxy's 502): the next call opens a new session
                self.failure = "its HTTP endpoint answered with an error status"
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

    async def _urls_asked(self, tool: str, data: object) -> ToolOutput:
        import mcp_types

        slot = self.inflight.current()
        listed = data.get("elicitations") if isinstance(data, dict) else None
        asks = [e for e in listed or [] if isinstance(e, dict) and isinstance(e.get("url"), str)]
        name = mcp_tool_name(self.config.name, tool)
        if slot is None or slot.ctx.runtime is None or not asks:
            raise ToolCallError(f"{name} needs the user to open a URL first; nobody can do it here")
        actions = []
        for ask in asks[:5]:
            params = mcp_types.ElicitRequestURLParams(
                message=str(ask.get("message") or "Open this link to go on"), url=ask["url"]
            )
            actions.append((await self.requests.ask(slot, params)).action)
        if all(action == "accept" for action in actions):
            return ToolOutput(
                content=f"{name} needed the user to complete a step in their browser; they "
                "say it is done, so call it again with the same arguments",
                is_error=True,
            )
        raise ToolCallError(
            f"{name} needs the user to complete a step in their browser, and they did not "
            f"({', '.join(actions)}); tell the user what the tool needs"
        )

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


#: the SDK's message for an HTTP error status that carried no JSON-RPC error
_HTTP_ERROR_STATUS = "Server returned an error response"


class _UrlRequired(Exception):
    """The server answered a call with the URLs a person must open first (-32042)."""

    def __init__(self, data: object) -> None:
        self.data = data


class _SessionEnded(Exception):
    """The HTTP server answered 404 for the session: it no longer knows it."""


#: pauses between the attempts to start a server that went down (after the first, at once)
RECONNECT_BACKOFF_S = (0.1, 0.4, 1.6)


def _bearer(config: McpServerConfig) -> Any:
    """The OAuth login of an HTTP server on its requests (None: it has none)."""
    if config.auth is None or config.url is None:
        return None
    from lodger.tools._mcp_bearer import BearerAuth

    return BearerAuth(server=config.name, url=config.url, oauth=config.auth)


def _client_info() -> mcp_types.Implementation:
    import mcp_types

    return mcp_types.Implementation(name="lodger", version="0.1")


async def _offers_resources(client: Client) -> bool:
    """Whether the server has a resource or a template to read (its first pages)."""
    from mcp.shared.exceptions import MCPError

    if client.server_capabilities.resources is None:
        return False
    try:
        if (await client.list_resources()).resources:
            return True
        return bool((await client.list_resource_templates()).resource_templates)
    except (MCPError, ValidationError):
        return False  # a server that cannot list them offers none we can use


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
        return await connection.call(raw, arguments, ctx)

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

    def __init__(
        self, configs: Sequence[McpServerConfig], *, workspace: Path | None = None
    ) -> None:
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"two MCP servers share a name in {names}")
        self._connections = [_Connection(c, workspace) for c in configs]
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
            tools, unusable = self._bound(connection, taken)
            self._tools.extend(tools)
            self._unusable.update(unusable)
        return self

    @staticmethod
    def _bound(connection: _Connection, taken: set[str]) -> tuple[list[Tool], dict[str, str]]:
        tools, unusable = McpServers._listed(connection, taken)
        resources, subscribe = connection.offers()
        if resources:
            for t in resource_tools(
                connection.config.name, connection, subscribe=subscribe, named=mcp_tool_name
            ):
                if t.name in taken:  # the server lists a tool of that name: its own wins
                    continue
                taken.add(t.name)
                tools.append(t)
        return tools, unusable

    @staticmethod
    def _listed(connection: _Connection, taken: set[str]) -> tuple[list[Tool], dict[str, str]]:
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
        if connection.listing is not None and connection.listing.unnamed:
            _log.warning(
                "MCP server %r lists %d tools without a usable name; they are left out",
                connection.config.name,
                connection.listing.unnamed,
            )
        return _bind(definitions, config=connection.config, connection=connection, taken=taken)

    # ``ToolSource`` (lodger.tools.registry): a ``list_changed`` rebinds at the next step

    def stale(self) -> bool:
        return any(c.tools_stale and c.failure is None for c in self._connections)

    async def refresh(self) -> list[ToolsReplaced]:
        """The tools of each server that said its listing changed, listed again; a server
        that cannot list keeps its tools (and is asked again at its next change)."""
        out: list[ToolsReplaced] = []
        for connection in self._connections:
            if not connection.tools_stale or connection.failure is not None:
                continue
            name = connection.config.name
            try:
                listed = await connection.relist()
            except Exception as exc:  # noqa: BLE001 - a failed relisting costs its server only
                _log.warning(
                    "MCP server %r could not list its tools again: %s", name, _describe(exc)
                )
                continue
            if listed is None:
                continue
            taken = {t.name for t in self._tools if t.group != name}
            tools, unusable = self._bound(connection, taken)
            self._tools = [t for t in self._tools if t.group != name] + tools
            self._unusable = {
                k: v for k, v in self._unusable.items() if not k.startswith(f"{name}__")
            }
            self._unusable.update(unusable)
            out.append(ToolsReplaced(group=name, tools=tools, unusable=sorted(unusable)))
        return out

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

    def _connection(self, server: str) -> _Connection:
        for connection in self._connections:
            if connection.config.name == server:
                return connection
        names = ", ".join(c.config.name for c in self._connections) or "none"
        raise UsageError(
            f"no MCP server is named {server!r} in this run (servers: {names})",
            hint="name a server of lodger.toml's [mcp.servers] or of --mcp",
            code="usage",
        )

    async def read(self, server: str, uri: str) -> str:
        """Resource ``uri`` of ``server`` as text (for a turn's input)."""
        try:
            return await self._connection(server).read_resource(uri)
        except ToolCallError as exc:
            raise UsageError(exc.message, code="usage") from None

    async def prompt(self, server: str, name: str, arguments: dict[str, str]) -> str:
        """Prompt ``name`` of ``server`` with ``arguments``, as text (for a turn's input)."""
        try:
            return await self._connection(server).prompt(name, arguments)
        except ToolCallError as exc:
            raise UsageError(exc.message, code="usage") from None

    async def expand(self, given: McpInput) -> UserInput:
        """A turn's input that names resources and a prompt, read now."""
        return await expand(self, given)

    def updates(self) -> str:
        """The system prompt's note of resources the servers said changed (empty: none)."""
        lines = [
            f"- {c.config.name}: {', '.join(c.updated)}" for c in self._connections if c.updated
        ]
        if not lines:
            return ""
        return (
            "MCP resources updated since they were last read (read them again with "
            "<server>__read_resource):\n" + "\n".join(lines)
        )

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
