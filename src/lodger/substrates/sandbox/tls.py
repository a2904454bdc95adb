"""The lodger CA: certificates for the domains whose TLS the egress proxy terminates.

A policy may mark allowed domains for TLS termination (``NetworkPolicy.terminate_tls``)
so that the proxy can add credential headers to HTTPS requests too. For that the proxy
must speak TLS to the sandbox as that domain: it holds a certificate authority made for
one proxy (one sandboxed command), issues a leaf certificate per marked domain on the
first connection, and the sandbox (only the sandbox) trusts that CA.

- The CA's private key exists only in the proxy's memory; a leaf's key is written to a
  private directory outside the sandbox just long enough for ``ssl`` to load it, then
  deleted. Neither is ever mounted into the sandbox.
- The CA certificate carries name constraints naming the marked domains where they are
  plain names (``api.example.com``, ``*.example.com``), so even its own certificate
  cannot vouch for any other name.
- The sandbox gets a trust bundle, the lodger CA followed by the host's CA bundle, and
  ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS``,
  ``GIT_SSL_CAINFO`` and ``PIP_CERT`` pointing at it
  (``lodger.substrates.sandbox.egress.trust_environment``).

>>> ca = LodgerCA(("api.example.com",))
>>> context = ca.server_context("api.example.com")   # for ``StreamWriter.start_tls``
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import ssl
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LEAF_CACHE", "LodgerCA", "system_ca_bundle"]

#: leaf TLS contexts a CA keeps (least recently used go first)
LEAF_CACHE = 64
_LIFETIME = datetime.timedelta(days=1)
_SKEW = datetime.timedelta(hours=1)
_PLAIN = re.compile(r"(\*\.)?([a-z0-9-]+(\.[a-z0-9-]+)*)")


def system_ca_bundle() -> bytes:
    """The host's CA bundle (PEM), so the sandbox trusts what it trusted before too."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and os.path.isfile(candidate):
            return Path(candidate).read_bytes()
    return b""


class LodgerCA:
    """A CA made in memory for one egress proxy; see the module doc."""

    def __init__(self, domains: Sequence[str]) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lodger"),
                x509.NameAttribute(NameOID.COMMON_NAME, "lodger sandbox egress CA"),
            ]
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
        )
        permitted = _name_constraints(domains)
        if permitted:
            builder = builder.add_extension(
                x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None),
                critical=True,
            )
        self.certificate = builder.sign(self._key, hashes.SHA256())
        self.certificate_pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf certificate for ``host``."""
        host = host.lower().rstrip(".")
        with self._lock:  # the proxy calls this from worker threads
            context = self._contexts.pop(host, None)
            if context is None:
                context = self._issue(host)
                # The most recent LEAF_CACHE only: under a wildcard a command could make
                # every connection a new name, each leaf held in lodger's process.
                while len(self._contexts) >= LEAF_CACHE:
                    del self._contexts[next(iter(self._contexts))]
            self._contexts[host] = context  # last: the most recently used
            return context

    def _issue(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # ssl loads keys from files only: a private directory, deleted at once.
        private = tempfile.mkdtemp(prefix="lodger-leaf-")
        try:
            path = os.path.join(private, "leaf.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption(),
                    )
                )
                file.write(leaf.public_bytes(serialization.Encoding.PEM))
                file.write(self.certificate_pem)
            context.load_cert_chain(path)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return context


def _name_constraints(domains: Sequence[str]) -> list[x509.GeneralName]:
    # A DNS name constraint 'example.com' covers example.com and every name under it.
    # A pattern that is not a plain name or '*.' + name ('api-?.example.com') cannot be
    # expressed: then no constraint at all, rather than one that refuses a marked name.
    names: list[x509.GeneralName] = []
    for pattern in domains:
        match = _PLAIN.fullmatch(pattern.lower().rstrip("."))
        if match is None:
            return []
        names.append(x509.DNSName(match.group(2)))
    return names
