"""The file tools hold the workspace against swapped symlinks, special files, lodger's own
state directory and .gitignore'd noise: real directories, FIFOs, sockets and a real
renameat2(RENAME_EXCHANGE) racer in another process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.runtime.builtin import edit_file, grep, list_files, read_file, shell, write_file
from lodger.tools.spec import Tool, ToolContext, ToolOutput


async def call(t: Tool, ctx: ToolContext, **arguments: Any) -> str:
    result = await t.handler(arguments, ctx)
    if isinstance(result, ToolOutput):
        assert not result.is_error, result.content
        return result.content
    assert isinstance(result, str)
    return result


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def is_fifo(path: Path) -> bool:
    return path.is_fifo()


# ---------------------------------------------------------------- a symlink swapped mid-call

# Swaps two names atomically, as fast as it can, until killed. glibc has had renameat2
# since 2.28; the raw syscall is the fallback.
_RACER = textwrap.dedent(
    """
    import ctypes, os, platform, sys
    libc = ctypes.CDLL(None, use_errno=True)
    a, b = (os.fsencode(p) for p in sys.argv[1:3])
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        number = {"x86_64": 316, "aarch64": 276}[platform.machine()]
        def fn(*args, _n=number):
            return libc.syscall(_n, *args)
    if fn(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        sys.exit("renameat2 failed: errno %d" % ctypes.get_errno())
    print("ready", flush=True)
    while True:
        fn(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    """
)


@pytest.fixture
def racer(ws: Path, outside: Path) -> Iterator[Callable[[], None]]:
    """``ws/d`` (a real directory) and ``ws/s`` (a symlink to ``outside``), swapped nonstop
    until the test calls the fixture's value (or ends)."""
    (ws / "d").mkdir()
    (ws / "d" / "f.txt").write_text("INSIDE\n")
    (outside / "f.txt").write_text("OUTSIDE\n")
    (ws / "s").symlink_to(outside)
    process = subprocess.Popen(
        [sys.executable, "-c", _RACER, str(ws / "d"), str(ws / "s")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line != "ready\n":
            process.wait()
            assert process.stderr is not None
            pytest.fail(f"the racer did not start: {process.stderr.read()}")

        def stop() -> None:
            process.kill()
            process.communicate()  # reaps it and closes its pipes

        yield stop
    finally:
        if process.returncode is None:
            process.kill()
            process.communicate()


@pytest.mark.slow
async def test_a_directory_swapped_for_an_outside_symlink_never_leaks_a_read(
    ws: Path, outside: Path, ctx: ToolContext, racer: Callable[[], None]
) -> None:
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        try:
            out = await call(read_file, ctx, path="d/f.txt")
        except ToolCallError as exc:
            seen[f"refused ({exc.code})"] += 1
            continue
        except OSError as exc:  # an error that would end the turn, not a result
            seen[f"crashed ({exc.strerror})"] += 1
            continue
        seen["read outside" if "OUTSIDE" in out else "read inside"] += 1
        assert "OUTSIDE" in out or out == "     1\tINSIDE"
    outcomes = set(seen)
    # Both sides of the race were seen, so the swap was live while the tool ran ...
    assert "read inside" in outcomes, seen
    assert "refused (path_outside)" in outcomes, seen
    # ... and nothing else happened: no outside byte, no crash.
    assert outcomes <= {
        "read inside",
        "refused (path_outside)",
        "refused (path_not_found)",
        "refused (path_changing)",
    }, seen


@pytest.mark.slow
async def test_a_directory_swapped_for_an_outside_symlink_never_takes_a_write(
    ws: Path, outside: Path, ctx: ToolContext, racer: Callable[[], None]
) -> None:
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for path, content in (("d/planted.txt", "PLANTED\n"), ("d/f.txt", "OVERWRITTEN\n")):
            try:
                await call(write_file, ctx, path=path, content=content)
            except ToolCallError as exc:
                seen[f"refused ({exc.code})"] += 1
                continue
            except OSError as exc:  # an error that would end the turn, not a result
                seen[f"crashed ({exc.strerror})"] += 1
                continue
            seen["written"] += 1
    racer()  # stopped: the names hold still for the checks
    assert names_in(outside) == ["f.txt", "secret.txt"], seen
    assert (outside / "f.txt").read_text() == "OUTSIDE\n"
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
    assert "written" in seen, seen
    assert "refused (path_outside)" in seen, seen
    # every other outcome is a refusal; one that kept meeting a swapped symlink counts its
    # hops across retries and may give up as too many (path_loop: 1 in ~3,000 under load)
    refusals = {"refused (path_outside)", "refused (path_changing)", "refused (path_loop)"}
    assert set(seen) <= {"written", *refusals}, seen
    # Whatever was written landed inside, in the directory under whichever name it has now.
    inside = next(p for p in (ws / "d", ws / "s") if not p.is_symlink())
    assert (inside / "planted.txt").read_text() == "PLANTED\n"


# ---------------------------------------------------------------- FIFOs and sockets


@pytest.fixture
def fifo(ws: Path) -> Iterator[Path]:
    path = ws / "pipe"
    os.mkfifo(path)
    yield path
    # Should a tool block in open() on it, give it a peer so its thread can finish.
    if path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


@pytest.mark.timeout(10)
async def test_read_file_refuses_a_fifo_without_blocking(
    fifo: Path, ws: Path, ctx: ToolContext
) -> None:
    with pytest.raises(ToolCallError) as info:
        await asyncio.wait_for(call(read_file, ctx, path="pipe"), timeout=5)
    assert str(info.value) == (
        "cannot read 'pipe': it is a FIFO (named pipe), not a regular file; "
        "the file tools only work on regular files; choose another path"
    )
    assert info.value.code == "not_regular_file"


@pytest.mark.timeout(10)
async def test_write_and_edit_refuse_a_fifo_and_leave_it_in_place(
    fifo: Path, ctx: ToolContext
) -> None:
    assert write_file.expectations is not None
    with pytest.raises(ToolCallError, match="it is a FIFO"):
        await asyncio.wait_for(write_file.expectations({"path": "pipe", "content": "x"}, ctx), 5)
    with pytest.raises(ToolCallError, match="cannot write 'pipe': it is a FIFO"):
        await asyncio.wait_for(call(write_file, ctx, path="pipe", content="x"), timeout=5)
    with pytest.raises(ToolCallError, match="it is a FIFO"):
        await asyncio.wait_for(
            call(edit_file, ctx, path="pipe", old_string="a", new_string="b"), timeout=5
        )
    assert is_fifo(fifo)


@pytest.mark.timeout(10)
async def test_grep_skips_a_fifo_and_list_files_lists_it(
    fifo: Path, ws: Path, ctx: ToolContext
) -> None:
    (ws / "a.txt").write_text("needle\n")
    assert await asyncio.wait_for(call(grep, ctx, pattern="needle"), 5) == "a.txt:1: needle"
    assert (await call(list_files, ctx)).splitlines() == ["a.txt", "pipe"]


async def test_a_unix_socket_is_refused_not_a_crash(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ws)  # a relative bind keeps the socket path short
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("sock")
        server.listen()
        with pytest.raises(ToolCallError, match="cannot read 'sock': it is a socket"):
            await call(read_file, ctx, path="sock")
        with pytest.raises(ToolCallError, match="cannot write 'sock': it is a socket"):
            await call(write_file, ctx, path="sock", content="x")
        (ws / "a.txt").write_text("needle\n")
        assert await call(grep, ctx, pattern="needle") == "a.txt:1: needle"
        assert (ws / "sock").is_socket()


# ---------------------------------------------------------------- the state directory


@pytest.fixture
def state(ws: Path) -> Path:
    """A state directory inside the workspace, as with ``--workspace .`` and the default."""
    directory = ws / ".lodger"
    (directory / "locks").mkdir(parents=True)
    (directory / "log.sqlite3").write_bytes(b"SQLite format 3\x00 needle")
    (directory / "locks" / "s-1.lock").write_text("pid 1 needle\n")
    (ws / "README.md").write_text("needle\n")
    return directory


@pytest.fixture
def hidden_ctx(ctx: ToolContext, state: Path) -> ToolContext:
    return ToolContext(
        session_id=ctx.session_id,
        turn_id=ctx.turn_id,
        run_id=ctx.run_id,
        call_id=ctx.call_id,
        operation_id=ctx.operation_id,
        workspace=ctx.workspace,
        hidden=(state.resolve(),),
    )


async def test_write_file_to_the_log_is_refused_and_the_log_is_untouched(
    ws: Path, state: Path, hidden_ctx: ToolContext
) -> None:
    before = (state / "log.sqlite3").read_bytes()
    with pytest.raises(ToolCallError) as info:
        await call(write_file, hidden_ctx, path=".lodger/log.sqlite3", content="gone")
    assert info.value.code == "path_hidden"
    assert str(info.value).startswith(
        "path '.lodger/log.sqlite3' is inside lodger's state directory '.lodger'; "
        "no tool may read or write it"
    )
    assert (state / "log.sqlite3").read_bytes() == before
    assert names_in(state) == ["locks", "log.sqlite3"]


@pytest.mark.parametrize(
    "path",
    [
        ".lodger/log.sqlite3",
        ".lodger/new.txt",
        ".lodger/deeper/new.txt",
        "./docs/../.lodger/log.sqlite3",
        "alias/log.sqlite3",
        "alias-file",
        "ABSOLUTE",
    ],
)
async def test_every_spelling_of_the_state_directory_is_refused(
    ws: Path, state: Path, hidden_ctx: ToolContext, path: str
) -> None:
    (ws / "docs").mkdir()
    (ws / "alias").symlink_to(".lodger")
    (ws / "alias-file").symlink_to(".lodger/log.sqlite3")
    path = str(state / "log.sqlite3") if path == "ABSOLUTE" else path
    before = (state / "log.sqlite3").read_bytes()
    edit = {"old_string": "needle", "new_string": "pin"}
    for t, arguments in (
        (read_file, {"path": path}),
        (write_file, {"path": path, "content": "x"}),
        (edit_file, {"path": path, **edit}),
    ):
        with pytest.raises(ToolCallError, match="lodger's state directory") as info:
            await call(t, hidden_ctx, **arguments)
        assert info.value.code == "path_hidden"
        assert t.claims is not None
        with pytest.raises(ToolCallError, match="lodger's state directory"):
            t.claims(arguments, hidden_ctx)
    assert (state / "log.sqlite3").read_bytes() == before
    assert names_in(state) == ["locks", "log.sqlite3"]


async def test_write_expectations_refuse_the_state_directory(
    state: Path, hidden_ctx: ToolContext
) -> None:
    assert write_file.expectations is not None
    with pytest.raises(ToolCallError, match="lodger's state directory"):
        await write_file.expectations({"path": ".lodger/x", "content": "x"}, hidden_ctx)


async def test_list_files_and_grep_skip_the_state_directory(
    state: Path, hidden_ctx: ToolContext
) -> None:
    assert await call(list_files, hidden_ctx) == "README.md"
    assert await call(list_files, hidden_ctx, pattern="**/*.lock") == (
        "no entries match '**/*.lock' under '.'"
    )
    assert await call(grep, hidden_ctx, pattern="needle") == "README.md:1: needle"
    for t in (list_files, grep):
        arguments = {"path": ".lodger"} if t is list_files else {"pattern": "x", "path": ".lodger"}
        with pytest.raises(ToolCallError, match="lodger's state directory"):
            await call(t, hidden_ctx, **arguments)


async def test_a_state_directory_not_yet_created_is_refused_by_name(
    ws: Path, ctx: ToolContext
) -> None:
    hidden = ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=ws, hidden=(ws / "var" / "state",),
    )  # fmt: skip
    with pytest.raises(ToolCallError, match="lodger's state directory 'var/state'"):
        await call(write_file, hidden, path="var/state/log.sqlite3", content="x")
    assert not (ws / "var").exists()


async def test_shell_refuses_a_command_naming_the_state_directory(
    ws: Path, state: Path, hidden_ctx: ToolContext
) -> None:
    assert shell.claims is not None
    for command in (
        "cat .lodger/log.sqlite3",
        "rm -rf ./.lodger",
        f"truncate -s0 {state}/log.sqlite3",
        "ls '.lodger'",
    ):
        # Refused while computing claims, i.e. before anyone is asked to approve it.
        with pytest.raises(ToolCallError, match=r"names '\.lodger', lodger's state directory"):
            shell.claims({"command": command}, hidden_ctx)
        with pytest.raises(ToolCallError, match="lodger's state directory"):
            await shell.handler({"command": command}, hidden_ctx)
    assert (state / "log.sqlite3").exists()
    # A name that merely contains it is someone else's file.
    out = await call(shell, hidden_ctx, command="echo notes.lodgerx; echo my.lodger")
    assert out == "notes.lodgerx\nmy.lodger\n[exit code 0]"


# ---------------------------------------------------------------- .gitignore


@pytest.fixture
def ignoring(ws: Path) -> Path:
    files = {
        ".gitignore": "build/\n*.log\n!keep.log\nnode_modules\n",
        "src/main.py": "needle\n",
        "src/.gitignore": "generated.py\n",
        "src/generated.py": "needle\n",
        "build/out.txt": "needle\n",
        "node_modules/pkg/index.js": "needle\n",
        "debug.log": "needle\n",
        "keep.log": "needle\n",
        "excluded.tmp": "needle\n",
        ".git/info/exclude": "*.tmp\n",
        ".git/config": "needle\n",
    }
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


async def test_list_files_skips_what_gitignore_ignores_and_says_so(
    ignoring: Path, ctx: ToolContext
) -> None:
    assert (await call(list_files, ctx)).splitlines() == [
        ".gitignore",
        "keep.log",
        "src/",
        "src/.gitignore",
        "src/main.py",
        "[5 entries ignored by .gitignore are not listed: build/, debug.log, excluded.tmp, "
        "node_modules/, src/generated.py; pass one as `path` to list it]",
    ]


async def test_grep_skips_what_gitignore_ignores(ignoring: Path, ctx: ToolContext) -> None:
    assert (await call(grep, ctx, pattern="needle")).splitlines() == [
        "keep.log:1: needle",
        "src/main.py:1: needle",
    ]


async def test_an_explicit_path_inside_an_ignored_directory_is_searched(
    ignoring: Path, ctx: ToolContext
) -> None:
    assert (await call(list_files, ctx, path="node_modules")).splitlines() == [
        "node_modules/pkg/",
        "node_modules/pkg/index.js",
    ]
    assert await call(grep, ctx, pattern="needle", path="build") == "build/out.txt:1: needle"
    assert await call(grep, ctx, pattern="needle", path="node_modules/pkg") == (
        "node_modules/pkg/index.js:1: needle"
    )
    assert await call(grep, ctx, pattern="needle", path=".git") == ".git/config:1: needle"
    assert await call(read_file, ctx, path="debug.log") == "     1\tneedle"
    assert await call(grep, ctx, pattern="needle", path="src/generated.py") == (
        "src/generated.py:1: needle"
    )


# ---------------------------------------------------------------- symlinks that stay inside


async def test_inside_symlinks_are_followed_component_by_component(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "x.txt").write_text("x in sub\n")
    (ws / "link").symlink_to("sub/deep")
    (ws / "abs").symlink_to(ws / "sub")
    # As the kernel does: '..' after a symlink climbs from its target, not from the link.
    assert await call(read_file, ctx, path="link/../x.txt") == "     1\tx in sub"
    assert await call(read_file, ctx, path="abs/x.txt") == "     1\tx in sub"
    await call(write_file, ctx, path="link/new.txt", content="new\n")
    assert (ws / "sub" / "deep" / "new.txt").read_text() == "new\n"


async def test_a_symlink_loop_is_a_model_error(ws: Path, ctx: ToolContext) -> None:
    (ws / "loop").symlink_to("loop")
    with pytest.raises(ToolCallError, match="too many levels of symbolic links"):
        await call(read_file, ctx, path="loop")
    with pytest.raises(ToolCallError, match="too many levels of symbolic links"):
        await call(write_file, ctx, path="loop/x.txt", content="x")
