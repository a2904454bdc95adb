"""A real S3-compatible server on loopback for the tests: moto's server, started as a
subprocess on a free port (it implements create-only puts, ``If-None-Match: *``)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUCKET = "lodger-tests"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "lodger-test-key",
    "AWS_SECRET_ACCESS_KEY": "lodger-test-secret",
    "AWS_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def url(self, prefix: str | None = None) -> str:
        """A fresh ``s3://`` URL (a new prefix each call unless one is given)."""
        prefix = prefix or uuid.uuid4().hex
        return f"s3://{BUCKET}/{prefix}?endpoint={self.endpoint}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_s3_server() -> Iterator[S3Server]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it accepts connections (readiness, not a timing guess)
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("moto server did not start within 60 s")
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_REGION"],
        ).create_bucket(Bucket=BUCKET)
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def set_credentials(environ: dict[str, str] | None = None) -> None:
    (os.environ if environ is None else environ).update(CREDENTIALS)


S3RVER = Path(__file__).resolve().parents[1] / "s3_servers" / "node_modules" / ".bin" / "s3rver"
#: s3rver's built-in account
S3RVER_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "S3RVER",
    "AWS_SECRET_ACCESS_KEY": "S3RVER",
    "AWS_REGION": "us-east-1",
}


@contextlib.contextmanager
def running_s3rver(data_dir: Path) -> Iterator[S3Server]:
    """s3rver (npm), an S3-compatible server that ignores ``If-None-Match`` on PUT.
    Installed by scripts/install.sh; a missing one fails the test (CI installs it)."""
    if not S3RVER.exists():
        raise RuntimeError(f"s3rver is not installed at {S3RVER}: run scripts/install.sh")
    port = _free_port()
    proc = subprocess.Popen(
        [str(S3RVER), "-d", str(data_dir), "-a", "127.0.0.1", "-p", str(port), "--silent",
         "--configure-bucket", BUCKET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"s3rver exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("s3rver did not start within 60 s")
            time.sleep(0.05)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
