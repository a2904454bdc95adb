"""``tests/mcp_servers/tiny_server.py`` over stdio, counting its starts: each start
appends a line to the file named by the first argument (outside every lodger process),
so a test can tell whether a door started the project's MCP server at all."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

TINY = Path(__file__).resolve().parents[1] / "mcp_servers" / "tiny_server.py"

if __name__ == "__main__":
    with Path(sys.argv[1]).open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    sys.argv = [str(TINY)]
    runpy.run_path(str(TINY), run_name="__main__")
