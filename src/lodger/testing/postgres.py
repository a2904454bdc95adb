"""A real PostgreSQL server for tests and benchmarks: ``initdb`` into a temp dir, ``pg_ctl`` on a
free loopback port, as the ``postgres`` user when the tests run as root (the server
refuses root). ``restart()`` stops and starts it mid-test."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

from lodger._core.extras import require

with require("postgres", "the PostgreSQL test server"):
    import psycopg


def server_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are; a clear failure when PostgreSQL is missing."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    for directory in candidates:
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; run ./scripts/install.sh "
        "(it installs the Debian package postgresql)"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    def __init__(self, *, max_connections: int = 200) -> None:
        self.max_connections = max_connections
        self.bindir = server_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="lodger-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.port = _free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            try:
                pwd.getpwnam(self.user)
            except KeyError as exc:
                raise RuntimeError(
                    "running as root needs the 'postgres' system user (the Debian "
                    "postgresql package creates it); run ./scripts/install.sh"
                ) from exc
            shutil.chown(self.root, user=self.user)

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stdout}{result.stderr}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "lodger", "-E", "UTF8",
                  "--no-sync", "--no-instructions")  # fmt: skip
        self.start()

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c max_connections={self.max_connections} -c shared_buffers=16MB"
            # every slot for the tests' user (a superuser): a full server is really full
            + (" -c superuser_reserved_connections=0" if self.max_connections < 10 else "")
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "-o", options, "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://lodger@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its DSN."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
