"""TLS contexts: the HTTP server's (its certificate, optionally client certificates, reloaded when
the files change) and the one a sink's client connects with (`client_context`).

`ServerTls.context()` is asked for on every new connection and costs three
`stat` calls when nothing changed, so a certificate renewed on disk (cert-manager,
an ACME client) is served from the next connection on without a restart. A
renewal caught half written keeps the last good context and says why once.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerTls", "TlsError", "client_context"]


class TlsError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(eq=False)
class ServerTls:
    """The server's certificate and key, and the CA that client certificates must chain to.

    With `client_ca` set, a client MAY present a certificate; one that does not verify against
    that CA fails the handshake. Without a certificate the connection is still served (the kubelet's
    probes carry none); which paths need a verified client is the server's decision.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None
    _cache: tuple[tuple[tuple[int, int, int], ...], ssl.SSLContext] | None = field(default=None, repr=False)
    last_error: str | None = field(default=None, repr=False)

    def _files(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as err:
            raise TlsError(f"cannot use certificate {self.cert} with key {self.key}: {_why(err)}") from err
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as err:
                raise TlsError(f"cannot use client CA file {self.client_ca}: {_why(err)}") from err
            # OPTIONAL, not REQUIRED: a certificate that is presented must verify, but the kubelet's
            # HTTPS probes present none and must still reach /healthz and /readyz.
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: rebuilt when a file changed; TlsError if none can be built."""
        try:
            stamps = tuple(_stamp(p) for p in self._files())
        except OSError as err:
            if self._cache is not None:
                self.last_error = f"cannot stat {err.filename}: {err.strerror}; serving the last good files"
                return self._cache[1]
            raise TlsError(f"cannot read {err.filename}: {err.strerror}") from err
        if self._cache is None or self._cache[0] != stamps:
            try:
                ctx = self._build()
            except TlsError as err:
                if self._cache is None:
                    raise
                self.last_error = f"{err}; serving the last good files"
                return self._cache[1]
            self._cache = (stamps, ctx)
            self.last_error = None
        return self._cache[1]


def _why(err: OSError | ssl.SSLError) -> str:
    if isinstance(err, ssl.SSLError):
        return err.reason or str(err)
    return err.strerror or str(err)


def client_context(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None, *, verify: bool = True
) -> ssl.SSLContext:
    """A client's context: the system's CAs or `ca_file`, a client certificate when both files
    are given, and verification on unless `verify` is False (tests only)."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
