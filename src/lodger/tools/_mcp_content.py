"""MCP resources and prompts: as deferred tools, and as a turn's input.

A server that offers resources gets three more deferred tools in its group, found
through ``tool_search`` like its own: ``<server>__list_resources`` (its resources and
resource templates, paginated, bounded), ``<server>__read_resource`` (one resource's
text; binary contents are described, not shown) and, where the server offers
subscriptions, ``<server>__subscribe_resource``: an update the server sends afterwards is
noted in the system prompt of the next step (until the resource is read again).

A turn's input may name resources and a prompt (``McpInput``): ``lodger run --resource
SERVER:URI --prompt SERVER:NAME --arg k=v``, the host's message fields ``resources`` and
``prompt``, or ``Sessions.run(McpInput(...))``. They are read once the turn's servers
are up, before the turn starts: the prompt's messages become the input's text (the
given text after them), and each resource's text follows, marked with its URI. What the
turn started with is what ``turn_started`` records, so a resume never reads them again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lodger._core.text import visible_text
from lodger.errors import ToolCallError, UsageError
from lodger.media import MediaItem, UserInput
from lodger.tools.spec import Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

__all__ = [
    "MCP_INPUT_PREFIX",
    "McpInput",
    "PromptRef",
    "ResourceRef",
    "decode_input",
    "encode_input",
    "parse_ref",
    "prompt_text",
    "resource_text",
    "resource_tools",
]

#: characters of one resource put into a turn's input or a tool result
MAX_RESOURCE_CHARS = 100_000
#: resources and templates one ``list_resources`` call shows
MAX_LISTED = 200


@dataclass(frozen=True, kw_only=True)
class ResourceRef:
    """A resource of an MCP server: ``server`` (its configured name) and ``uri``."""

    server: str
    uri: str


@dataclass(frozen=True, kw_only=True)
class PromptRef:
    """A prompt of an MCP server, by name, with its string arguments."""

    server: str
    name: str
    arguments: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class McpInput:
    """A turn's input that names MCP resources and a prompt, read when the turn starts."""

    text: str = ""
    resources: Sequence[ResourceRef] = ()
    prompt: PromptRef | None = None
    #: images and documents given with the text (``lodger.media``)
    media: Sequence[MediaItem] = ()

    def __post_init__(self) -> None:
        if not self.text.strip() and self.prompt is None and not self.resources:
            raise UsageError("a turn needs text, a prompt or a resource", code="usage")


#: how a queued message's text says it names MCP resources or a prompt: this line, then
#: ``encode_input``'s JSON. A host refuses a client's text that starts with it.
MCP_INPUT_PREFIX = "lodger-mcp/1\n"


def encode_input(given: McpInput) -> str:
    """``given`` (without media: those travel as the message's attachments) as a queued
    message's text."""
    import json

    prompt = given.prompt
    body = {
        "text": given.text,
        "resources": [{"server": r.server, "uri": r.uri} for r in given.resources],
        "prompt": None
        if prompt is None
        else {"server": prompt.server, "name": prompt.name, "arguments": dict(prompt.arguments)},
    }
    return MCP_INPUT_PREFIX + json.dumps(body, ensure_ascii=False, sort_keys=True)


def decode_input(text: str, media: Sequence[MediaItem] = ()) -> McpInput | None:
    """``encode_input``'s inverse (None: a plain text); a ``CorruptLogError`` for a text
    that starts like one and is not."""
    import json

    from lodger.errors import CorruptLogError

    if not text.startswith(MCP_INPUT_PREFIX):
        return None
    try:
        raw = json.loads(text[len(MCP_INPUT_PREFIX) :])
        p = raw["prompt"]
        return McpInput(
            text=str(raw["text"]),
            resources=[
                ResourceRef(server=str(r["server"]), uri=str(r["uri"])) for r in raw["resources"]
            ],
            prompt=None
            if p is None
            else PromptRef(
                server=str(p["server"]),
                name=str(p["name"]),
                arguments={str(k): str(v) for k, v in p["arguments"].items()},
            ),
            media=tuple(media),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptLogError(
            f"a queued message naming MCP resources cannot be read ({exc})",
            hint="the host's index was changed outside lodger; send the message again",
        ) from None


def parse_ref(spec: str, what: str) -> tuple[str, str]:
    """``SERVER:REST`` as (server, rest): ``every:demo://resource/1``, ``every:simple``."""
    server, sep, rest = spec.partition(":")
    if not sep or not server or not rest:
        raise UsageError(
            f"{what} {spec!r} is not SERVER:{'URI' if what == '--resource' else 'NAME'}",
            hint="e.g. --resource 'docs:file:///README.md' or --prompt git:summarize",
            code="usage",
        )
    return server, rest


def _bounded(text: str, what: str) -> str:
    text = visible_text(text)
    if len(text) <= MAX_RESOURCE_CHARS:
        return text
    cut = len(text) - MAX_RESOURCE_CHARS
    return f"{text[:MAX_RESOURCE_CHARS]}\n[lodger cut {what}: {cut} more characters]"


def resource_text(result: mcp_types.ReadResourceResult, uri: str) -> str:
    """A read resource's contents as text, each part marked with its URI."""
    import mcp_types

    parts = []
    for content in result.contents:
        where = str(content.uri or uri)
        kind = content.mime_type or ("text/plain" if hasattr(content, "text") else "binary")
        if isinstance(content, mcp_types.TextResourceContents):
            body = _bounded(content.text, f"resource {where}")
            parts.append(f"[resource {where} ({kind})]\n{body}\n[end of resource {where}]")
        else:
            size = len(content.blob) * 3 // 4
            parts.append(f"[resource {where}: {kind}, {size} bytes, not shown]")
    return "\n\n".join(parts) or f"[resource {uri} is empty]"


def prompt_text(result: mcp_types.GetPromptResult, describe: Callable[[Any], str]) -> str:
    """A prompt's messages as one text: a single user message as it is; several, each
    under its role (a block that is not text as ``describe`` says it)."""
    import mcp_types

    rendered: list[tuple[str, str]] = []
    for message in result.messages:
        block = message.content
        if isinstance(block, mcp_types.TextContent):
            text = visible_text(block.text)
        else:
            text = visible_text(describe(block))
        rendered.append((message.role, text))
    if len(rendered) == 1 and rendered[0][0] == "user":
        return rendered[0][1]
    return "\n\n".join(f"[{role}]\n{text}" for role, text in rendered)


async def _listing(client: Client) -> str:
    lines: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        page = await client.list_resources(cursor=cursor)
        for r in page.resources:
            about = f" - {r.description}" if r.description else ""
            lines.append(f"{r.uri}  {r.name}{f' ({r.mime_type})' if r.mime_type else ''}{about}")
        cursor = page.next_cursor
        if not cursor or len(lines) >= MAX_LISTED:
            break
    shown = lines[:MAX_LISTED]
    more = f"\n(and more: only the first {MAX_LISTED} are shown)" if len(lines) > MAX_LISTED else ""
    templates = await client.list_resource_templates()
    listed_templates = [
        f"{t.uri_template}  {t.name}{f' - {t.description}' if t.description else ''}"
        for t in templates.resource_templates[:MAX_LISTED]
    ]
    text = "resources:\n" + ("\n".join(shown) or "(none)") + more
    if listed_templates:
        text += "\n\nresource templates (fill in the {placeholders} and read the URI):\n"
        text += "\n".join(listed_templates)
    return visible_text(text)


def resource_tools(
    server: str, connection: Any, *, subscribe: bool, named: Callable[[str, str], str]
) -> list[Tool]:
    """The deferred resource tools of one server (``connection``: its ``_Connection``;
    ``named``: a tool's bound name)."""

    async def list_resources(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content=await connection.resources_listing())

    async def read_resource(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content=await connection.read_resource(str(arguments["uri"])))

    async def subscribe_resource(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        uri = str(arguments["uri"])
        await connection.subscribe(uri)
        return ToolOutput(content=f"subscribed to {uri}: an update is noted at the next step")

    uri = {"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]}
    specs = [
        ("list_resources", list_resources, {"type": "object", "properties": {}},
         f"List the resources and resource templates MCP server {server!r} offers."),
        ("read_resource", read_resource, uri,
         f"Read one resource of MCP server {server!r} by its URI (from list_resources, or a "
         "template with its placeholders filled in)."),
    ]  # fmt: skip
    if subscribe:
        specs.append(
            ("subscribe_resource", subscribe_resource, uri,
             f"Ask MCP server {server!r} to say when a resource changes; an update is noted "
             "in the next step's instructions.")
        )  # fmt: skip
    return [
        Tool(
            name=named(server, name),
            description=description,
            parameters=schema,
            handler=handler,
            group=server,
            deferred=True,
            writes=False,
        )
        for name, handler, schema, description in specs
    ]


async def expand(servers: Any, given: McpInput) -> UserInput:
    """``given`` as the turn's input: the prompt's text, the given text, each resource."""
    parts: list[str] = []
    if given.prompt is not None:
        p = given.prompt
        parts.append(await servers.prompt(p.server, p.name, dict(p.arguments)))
    if given.text.strip():
        parts.append(given.text)
    for ref in given.resources:
        parts.append(await servers.read(ref.server, ref.uri))
    text = "\n\n".join(parts)
    return [text, *given.media] if given.media else text


def unavailable(server: str, what: str, why: str) -> ToolCallError:
    return ToolCallError(f"MCP server {server!r} could not {what}: {why}")
