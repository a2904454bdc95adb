"""An Agent on the real Chat Completions adapter, over the wire server: a turn's attached
image and a tool's image reach the API as content parts (the tool's in a user message
after the tool message), and the cached prompt tokens land in the log's usage."""

from __future__ import annotations

from pathlib import Path

from test_openai_chat import DONE, call_piece, chunk
from wire_server import Stream, WireServer

from lodger import Agent, BinaryContent, tool
from lodger.events import ModelOutput, Usage
from lodger.providers.openai_chat import OpenAIChatModel

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(16))
SHOT = b"\x89PNG\r\n\x1a\n" + b"shot" * 4


@tool
def screenshot() -> BinaryContent:
    """Take a screenshot."""
    return BinaryContent(SHOT, "image/png", name="screen.png")


def usage(prompt: int, cached: int) -> tuple[str | None, str]:
    return chunk(
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": 5,
            "total_tokens": prompt + 5,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    )


async def test_attached_and_tool_images_reach_the_api_and_cached_tokens_are_logged(
    tmp_path: Path,
) -> None:
    with WireServer() as server:
        server.push(
            Stream(
                [
                    call_piece(0, "{}", call_id="call_1", name="screenshot"),
                    chunk({}, finish="tool_calls"),
                    usage(900, 512),
                    DONE,
                ]
            ),
            Stream([chunk({"content": "Both show a chart."}), chunk({}, finish="stop"), DONE]),
        )
        model = OpenAIChatModel(
            model="gpt-test", base_url=f"{server.base_url}/v1", api_key="sk-test"
        )
        async with Agent(model=model, tools=[screenshot], storage=tmp_path / "state") as agent:
            result = await agent.run(
                ["Compare with the screen:", BinaryContent(PNG, "image/png")], session="s"
            )
            events = await agent.log.read_all("s")
        await model.aclose()

    assert result.status == "completed"
    first, second = (r.body["messages"] for r in server.requests)
    png_url = "data:image/png;base64,iVBORw0KGgoAAQIDBAUGBwgJCgsMDQ4P"
    user = next(m for m in first if m["role"] == "user")
    assert {"type": "image_url", "image_url": {"url": png_url}} in user["content"]
    roles = [m["role"] for m in second]
    tool_at = roles.index("tool")
    assert roles[tool_at + 1] == "user"  # the tool's image, right after its tool message
    parts = second[tool_at + 1]["content"]
    assert parts[1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgpzaG90c2hvdHNob3RzaG90"},
    }
    outputs = [e.body for e in events if isinstance(e.body, ModelOutput)]
    assert outputs[0].usage == Usage(input_tokens=900, output_tokens=5, cache_read_tokens=512)
