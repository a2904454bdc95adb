"""A crashed MCP server's call explains itself from the server's stderr tail while the
runner's own exit closes that file in another thread. The explanation once raised
"ValueError: I/O operation on closed file" into the call (seen in CI: the model got
"tiny__crash failed: ValueError..." instead of "MCP server 'tiny' is not available")."""

from __future__ import annotations

import sys
import tempfile
import threading
from typing import TextIO, cast

from lodger.tools.mcp import McpServerConfig, _Connection


def test_the_stderr_tail_never_fails_on_a_file_closed_meanwhile() -> None:
    connection = _Connection(McpServerConfig(name="tiny", command=sys.executable))
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: widen the race
    try:
        for _ in range(300):
            stderr = cast(TextIO, tempfile.TemporaryFile("w+"))  # noqa: SIM115 - closed by the race
            stderr.write("line one\nTraceback: boom\n" * 50)
            connection._stderr = stderr
            closer = threading.Thread(target=stderr.close)
            closer.start()
            tail = connection._stderr_tail()  # raised ValueError when the close won the race
            closer.join()
            assert tail in ("", "Traceback: boom")
    finally:
        sys.setswitchinterval(before)
