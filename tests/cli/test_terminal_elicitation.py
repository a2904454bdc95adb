"""`lodger run` on a real terminal (a pty) answers an MCP server's question: the form is
asked field by field, a password is typed without echo, a wrong value is asked again,
and what the server got is what the person typed; the log withholds the password."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ASKING = Path(__file__).parent.parent / "mcp_servers" / "asking_server.py"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
SCRIPT = [
    {"calls": [{"name": "tool_search", "args": {"query": "select:ask__sign_in"}}]},
    {"calls": [{"name": "ask__sign_in", "args": {}}]},
    {"text": "signed in"},
]


class Terminal:
    """A child process on a pseudo-terminal, read as the user would see it."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
        env["TERM"] = "xterm-256color"
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.raw = b""

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.raw += chunk
        return bool(chunk)

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def expect(self, needle: str, *, since: int, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while (found := self.text.find(needle, since)) < 0:
            assert time.monotonic() < deadline, f"no {needle!r} in:\n{self.text[since:]}"
            self._read(0.2)
        return found + len(needle)

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or self._read(0.05):
            assert time.monotonic() < deadline, self.text
            self._read(0.2)
        os.close(self.master)
        return self.proc.wait()


@pytest.mark.slow
def test_the_terminal_answers_a_form_and_hides_the_password(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    state = tmp_path / "state"
    term = Terminal(
        [
            sys.executable,
            "-m",
            "lodger",
            "run",
            "sign in",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--workspace",
            str(ws),
            "--state",
            str(state),
            "--mcp",
            f"ask={sys.executable} {ASKING}",
        ],
        cwd=tmp_path,
    )
    asked = term.expect("MCP server ask asks:", since=0)
    end = term.expect("[y] answer  [n] decline  [c] cancel (default y): ", since=asked)
    assert "Sign in to the test service" in term.text[asked:end]
    term.send("y")
    end = term.expect("User name:", since=end)
    term.send("")  # required and empty: the whole form is asked again
    end = term.expect("Password:", since=end)
    term.send("first-try")
    end = term.expect("User name:", since=end)
    assert "user" in term.text[end - 200 : end]  # the problem was named
    term.send("ada")
    end = term.expect("Password:", since=end)
    term.send("hunter2")
    code = term.finish()
    out = term.text
    assert code == 0, out
    assert "hunter2" not in out  # typed without echo
    assert "turn completed" in out
    shown = subprocess.run(
        [sys.executable, "-m", "lodger", "log", "show", "--last", "--json", "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert "user=ada password_length=7" in shown
    flat = re.sub(r"\s", "", shown)
    assert '"content":{"user":"ada"},"withheld":["password"]' in flat
    assert "hunter2" not in shown and "first-try" not in shown


@pytest.mark.slow
def test_without_a_terminal_the_question_is_declined_by_policy(tmp_path: Path) -> None:
    """`lodger run --json` has nobody to ask (as a worker has not): the server's question
    is declined at once, the fact says so, and the turn goes on."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lodger",
            "run",
            "sign in",
            "--json",
            "--model",
            f"script:{tmp_path / 'script.json'}",
            "--workspace",
            str(ws),
            "--state",
            str(tmp_path / "state"),
            "--mcp",
            f"ask={sys.executable} {ASKING}",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    facts = [json.loads(line) for line in done.stdout.splitlines()]
    bodies = {f["kind"]: f["event"]["body"] for f in facts if f.get("type") == "fact"}
    assert bodies["elicitation_answered"]["action"] == "decline"
    assert bodies["elicitation_answered"]["by"] == "policy"
    assert "action=decline" in bodies["tool_responded"]["content"]
