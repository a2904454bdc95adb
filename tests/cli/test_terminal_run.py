"""`lodger run` on a real terminal (a pty): the approval prompt (allow once / always for
this tool in this session / deny), shell commands shown as commands, prompts that no live
line lands on, the spinner naming the running tool with its elapsed time, and the usage
line at the end; then a second, non-interactive run (`--last`) that honours "always"."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

TOOLS = '''
import time
from lodger import tool

@tool
def slow_step() -> str:
    """Takes a moment."""
    time.sleep(1.5)
    return "slow step done"
'''

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def shell(command: str) -> dict[str, object]:
    return {"name": "shell", "args": {"command": command}}


SCRIPT = {
    "turns": [
        [
            {"calls": [shell("rm -f notes.txt && echo gone")]},
            {"calls": [shell("echo one > one.txt"), {"name": "list_files", "args": {}}]},
            {"calls": [shell("echo two > two.txt")]},
            {"calls": [shell("echo three > three.txt"), {"name": "slow_step", "args": {}}]},
            {"text": "done"},
        ],
        [{"calls": [shell("echo four > four.txt")]}, {"text": "again"}],
    ]
}


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
        """Read until ``needle`` shows after text position ``since``; return its end."""
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
def test_prompt_spinner_and_usage_on_a_terminal_and_always_survives(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("keep me\n")
    (ws / "lodger.toml").write_text('[permissions]\nask = ["shell"]\n')
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    state = tmp_path / "state"
    base = [
        sys.executable, "-m", "lodger", "run", "--model", f"script:{tmp_path / 'script.json'}",
        "--tools", str(tmp_path / "tools.py"), "--workspace", str(ws), "--state", str(state),
    ]  # fmt: skip
    term = Terminal([*base[:4], "tidy up", *base[4:]], cwd=tmp_path)
    question = "[y] allow once  [a] always allow shell in this session  [n] deny (default n): "

    # 1. deny: the command is shown as the command line it is, not as JSON
    asked = term.expect("shell wants to run:", since=0)
    end = term.expect(question, since=asked)
    prompt = term.text[asked:end]
    assert "$ rm -f notes.txt && echo gone" in prompt
    assert '{"command"' not in prompt
    term.send("n")

    # 2. once: a parallel call's lines wait until the answer, never on the prompt line
    asked = term.expect("shell wants to run:", since=end)
    end = term.expect(question, since=asked)
    assert "$ echo one > one.txt" in term.text[asked:end]
    assert "list_files" not in term.text[asked:end]
    term.send("y")

    # 3. always: the next shell call of this session is not asked about
    asked = term.expect("shell wants to run:", since=end)
    end = term.expect(question, since=asked)
    assert "$ echo two > two.txt" in term.text[asked:end]
    term.send("a")

    after = term.expect("shell allowed (always, for this session)", since=end)
    code = term.finish()
    out = term.text
    assert code == 0, out
    assert out.count("wants to run:") == 3, out  # three, not four
    rest = out[after:]
    assert "shell allowed (allowed always for this session (offset" in rest
    # the spinner named the running tool with its elapsed time while slow_step ran
    assert re.search(r"running (shell, )?slow_step(?: \(2 calls\))?\s+\d+\.\d s", rest), rest
    assert re.search(
        r"usage: 0 tokens \(0 in, 0 out\) over 5 model calls; \d+ durable commits", rest
    )
    assert "turn completed" in rest
    assert (ws / "notes.txt").read_text() == "keep me\n"  # denied: never ran
    assert [(ws / f).read_text() for f in ("one.txt", "two.txt", "three.txt")] == [
        "one\n",
        "two\n",
        "three\n",
    ]

    # 4. a later turn, not on a terminal (nobody to ask), honours "always" from the log
    second = subprocess.run(
        [*base[:4], "and again", *base[4:], "--last"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert (ws / "four.txt").read_text() == "four\n"
    assert "usage:" not in second.stdout  # not a terminal: no usage line, no spinner
    assert "running" not in second.stdout
    assert "allowed always for this session" in second.stdout


def test_a_prompt_shows_commands_and_code_as_themselves() -> None:
    from lodger.cli._live import describe_call
    from lodger.runtime.builtin import workspace_tools

    tools = {t.name: t for t in workspace_tools()}
    multi = describe_call(tools["shell"], {"command": "make &&\nmake test", "timeout": 5})
    assert multi == ["$ make &&", "  make test", '({"timeout": 5})']
    code = describe_call(tools["run_python"], {"code": "import os\nprint(os.getcwd())"})
    assert code == [">>> import os", "... print(os.getcwd())"]
    other = describe_call(tools["write_file"], {"path": "a.txt", "content": "x" * 400})
    assert len(other) == 1 and other[0].startswith('{"path": "a.txt"') and len(other[0]) == 300
    assert describe_call(tools["list_files"], {}) == ["(no arguments)"]


@pytest.mark.slow
def test_ctrl_c_at_an_open_prompt_stops_the_turn_without_waiting_for_an_answer(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "lodger.toml").write_text('[permissions]\nask = ["shell"]\n')
    script = [{"calls": [shell("echo never > never.txt")]}, {"text": "done"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    args = [
        sys.executable, "-m", "lodger", "run", "try", "--session", "s1", "--model",
        f"script:{tmp_path / 'script.json'}", "--workspace", str(ws),
        "--state", str(tmp_path / "state"),
    ]  # fmt: skip
    term = Terminal(args, cwd=tmp_path)
    term.expect("(default n): ", since=0)
    term.proc.send_signal(signal.SIGINT)  # nobody answers the question
    code = term.finish(timeout=30)
    assert code == 130, term.text
    assert "continue it with `lodger resume s1" in term.text
    assert not (ws / "never.txt").exists()
