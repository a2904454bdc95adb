"""Images and documents: a turn's input may hold ``BinaryContent`` (bytes, or a file with
``BinaryContent.from_path``), ``ImageUrl`` and ``DocumentUrl``; a tool may return
``BinaryContent``. The bytes are stored as artifacts and the model gets them as parts.

    python examples/images.py
"""

import tempfile
from pathlib import Path

from lodger import (
    Agent,
    BinaryContent,
    FunctionModel,
    ImageUrl,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    UserMessage,
    tool,
    tool_call,
)

# the first bytes of a PNG file (lodger checks an image's bytes match its type)
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24


@tool
def screenshot() -> BinaryContent:
    """Take a screenshot of the app."""
    return BinaryContent(PNG, "image/png", name="app.png")


def model(request: ModelRequest) -> ModelResponse | str:
    last = request.messages[-1]
    if isinstance(last, UserMessage):
        for part in last.parts:  # bytes, or a URL the provider fetches (lodger never does)
            where = f"{len(part.data)} bytes" if part.data is not None else f"at {part.url}"
            print(f"the model got {part.media_type} {where}")
        return ModelResponse(calls=(tool_call("screenshot"),))
    assert isinstance(last, ToolResultMessage)
    (shot,) = last.parts
    return f"the screenshot is {shot.media_type}, {len(shot.data or b'')} bytes"


with tempfile.TemporaryDirectory() as state:
    chart = Path(state) / "chart.png"
    chart.write_bytes(PNG)
    with Agent(model=FunctionModel(model), tools=[screenshot], storage=state) as agent:
        result = agent.run_sync(
            [
                "Compare the chart with the photo, then take a screenshot.",
                BinaryContent.from_path(chart),
                ImageUrl("https://example.com/photo.jpg"),
            ]
        )
    assert result.output == "the screenshot is image/png, 32 bytes", result
    print(result.output)
