"""TLS termination in the egress proxy: a real HTTPS server on the host's loopback (with a
CA of its own that only the proxy is told to trust), a real bubblewrap sandbox running
curl and Python's urllib, and the lodger CA in between."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lodger.errors import ConfigError
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, NetworkPolicy, SandboxResult
from lodger.substrates.sandbox.tls import LodgerCA

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
SECRET = "sk-upstream-3f9c1e7d"


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    signer: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


class Upstream:
    """An HTTPS server on 127.0.0.1 whose certificate (for 'localhost') is signed by a
    test CA nobody trusts by default; it records every request head it receives."""

    def __init__(self, directory: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("upstream test CA", ca_key, None, ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = _cert("localhost", key, ca.subject, ca_key, ca=False)
        self.ca_file = directory / "upstream-ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        chain = directory / "upstream-leaf.pem"
        chain.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            + leaf.public_bytes(serialization.Encoding.PEM)
        )
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(chain)
        chain.unlink()
        self.heads: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\nhello over tls"
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # a client that gave up in the handshake
        finally:
            writer.close()

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


async def run(ws: Path, script: str, policy: NetworkPolicy, port: int) -> SandboxResult:
    return await BubblewrapSandbox().run(
        ["bash", "-c", script, "probe", str(port)],
        workspace=ws,
        env=ENV,
        limits=Limits(wall_time_s=60),
        network=policy,
    )


TERMINATED = r"""
port=$1
python3 - "$port" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(f"https://localhost:{sys.argv[1]}/py", timeout=20) as r:
    print("PY", r.status, r.read().decode())
EOF
curl -sS -v --max-time 20 -H "Host: evil.example" -H "Authorization: Bearer forged" \
    "https://localhost:$port/curl" 2>&1
echo
curl -sS --max-time 20 "http://localhost:$port/downgraded"
echo "-----BEGIN FORGED CA-----" >> /run/lodger/ca-bundle.pem && echo WROTE-BUNDLE
echo "--- what the sandbox can see"
env
cat /proc/self/environ | tr '\0' '\n'
for f in $(find /run /tmp "$PWD" -type f 2>/dev/null); do
    [ -S "$f" ] || { echo "== $f"; cat "$f"; }
done
"""


async def test_a_marked_domain_gets_its_credentials_over_https(ws: Path, tmp_path: Path) -> None:
    async with Upstream(tmp_path) as upstream:
        policy = NetworkPolicy(
            allow=("localhost",),
            credentials={"localhost": {"Authorization": f"Bearer {SECRET}"}},
            terminate_tls=("localhost",),
            upstream_ca=upstream.ca_file,
        )
        result = await run(ws, TERMINATED, policy, upstream.port)
    out = result.output.decode(errors="replace")
    assert result.exit_code == 0, out[:3000]
    assert "PY 200 hello over tls" in out, out[:2500]
    assert "hello over tls" in out.split("PY 200", 1)[1].split("---", 1)[0]  # curl too
    # The sandbox saw lodger's CA vouch for 'localhost', trusted through the variables.
    assert "issuer: O=lodger; CN=lodger sandbox egress CA" in out, out
    for variable in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        assert f"{variable}=/run/lodger/ca-bundle.pem" in out
    # The secret and any private key: nowhere in the sandbox (env, files, the requests
    # and responses as it saw them).
    assert SECRET not in out
    assert "PRIVATE KEY" not in out and "== /run/lodger/ca-bundle.pem" in out
    assert "WROTE-BUNDLE" not in out and "Read-only file system" in out
    # Upstream: both requests arrived with the credential, once, and the Host the
    # tunnel was opened to; the sandbox's own Authorization was replaced.
    assert len(upstream.heads) == 2, upstream.heads
    for head in upstream.heads:
        assert head.count(b"\r\nAuthorization: ") == 1
        assert f"\r\nAuthorization: Bearer {SECRET}\r\n".encode() in head
        assert f"\r\nHost: localhost:{upstream.port}\r\n".encode() in head
        assert b"evil.example" not in head and b"forged" not in head
    record = [
        (c.host, c.method, c.allowed, c.credentials_injected, c.tls_terminated)
        for c in result.connections
    ]
    assert record == [
        ("localhost", "GET", True, True, True),
        ("localhost", "GET", True, True, True),
        ("localhost", "GET", False, False, False),  # plain HTTP: its credentials stay home
    ]
    assert "refused: plain HTTP to a domain marked for TLS" in out
    # The leaf keys went as soon as ssl had loaded them.
    assert list(Path(tempfile.gettempdir()).glob("lodger-leaf-*")) == []  # noqa: ASYNC240 - a test reading the host after the fact


UNMARKED = r"""
curl -sS -v --max-time 20 "https://localhost:$1/strict" 2>&1 \
    | grep -E "issuer|SSL certificate problem"
curl -sS -k -v --max-time 20 "https://localhost:$1/insecure" 2>&1 | grep -E "issuer|hello"
echo
"""


async def test_an_unmarked_domain_is_tunnelled_untouched(ws: Path, tmp_path: Path) -> None:
    async with Upstream(tmp_path) as upstream:
        policy = NetworkPolicy(
            allow=("localhost",), credentials={"localhost": {"Authorization": f"Bearer {SECRET}"}}
        )
        result = await run(ws, UNMARKED, policy, upstream.port)
    out = result.output.decode(errors="replace")
    # TLS end to end: the sandbox sees the upstream's own certificate, which it does
    # not trust; the proxy added nothing to the encrypted request.
    assert "SSL certificate problem" in out, out
    assert "issuer: CN=upstream test CA" in out and "hello over tls" in out
    assert "lodger sandbox egress CA" not in out
    assert len(upstream.heads) == 1 and b"Authorization" not in upstream.heads[0]
    assert [(c.method, c.allowed, c.tls_terminated) for c in result.connections] == [
        ("CONNECT", True, False),
        ("CONNECT", True, False),
    ]


NOT_VERIFIED = r"""
curl -sS --max-time 20 "https://localhost:$1/x"; echo
python3 - "$1" <<'EOF'
import socket, sys
# CONNECT to a marked domain, then plain text where TLS should be.
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"CONNECT localhost:{sys.argv[1]} HTTP/1.1\r\n\r\n".encode())
s.recv(100)
s.sendall(b"GET /plain HTTP/1.1\r\nHost: localhost\r\n\r\n")
print("plain text answered with", s.recv(100))
EOF
"""


async def test_credentials_never_go_to_an_upstream_the_proxy_cannot_verify(
    ws: Path, tmp_path: Path
) -> None:
    async with Upstream(tmp_path) as upstream:
        # No upstream_ca: the host's trust store, which does not know the test CA.
        policy = NetworkPolicy(
            allow=("localhost",),
            credentials={"localhost": {"Authorization": f"Bearer {SECRET}"}},
            terminate_tls=("localhost",),
        )
        result = await run(ws, NOT_VERIFIED, policy, upstream.port)
    out = result.output.decode(errors="replace")
    assert "upstream certificate not trusted" in out, out
    assert "plain text answered with b''" in out, out
    assert upstream.heads == []
    untrusted, plain = result.connections
    assert not untrusted.allowed and untrusted.tls_terminated
    assert untrusted.reason.startswith("upstream certificate not trusted")
    assert not plain.allowed and plain.reason.startswith("no TLS from the sandbox")


def handshake(ca: LodgerCA, host: str) -> str:
    """A TLS handshake in memory: a client trusting ``ca`` against its leaf for ``host``."""
    client = ssl.create_default_context(cadata=ca.certificate_pem.decode())
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_hostname=host)
    server_side = ca.server_context(host).wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, out, peer_in in ((client_side, c_out, s_in), (server_side, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                return str(exc)
            peer_in.write(out.read())
        if client_side.version() and server_side.version():
            return "ok"
    return "no handshake"


def test_the_lodger_ca_vouches_only_for_the_marked_domains() -> None:
    ca = LodgerCA(("api.example.com", "*.files.example.com"))
    constraints = ca.certificate.extensions.get_extension_for_class(x509.NameConstraints)
    permitted = constraints.value.permitted_subtrees
    assert permitted is not None
    assert sorted(n.value for n in permitted) == ["api.example.com", "files.example.com"]
    assert ca.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # Its own leaves verify for a marked name; a leaf it issued for any other name is
    # refused by a client that trusts the CA (OpenSSL checks the name constraints).
    assert handshake(ca, "x.files.example.com") == "ok"
    assert "permitted subtree violation" in handshake(ca, "evil.org")
    with pytest.raises(ConfigError, match="allow-list does not name"):
        NetworkPolicy(allow=("pypi.org",), terminate_tls=("api.example.com",))
