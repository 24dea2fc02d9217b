"""Certificates for the TLS tests, made with the `openssl` command, and the contexts that use them."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

from testkit.tools import tool
from watcher.sim.apiserver.certificate import make_certificate

__all__ = ["client_context", "make_pki", "openssl", "require_openssl", "self_signed", "server_context"]

# P-256 keys: quick to make, and what the agent's TLS is tested with.
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def require_openssl() -> None:
    """Skip the test where the openssl command is missing; fail it under CI (testkit.tools)."""
    tool("openssl")


def openssl(cwd: Path, *args: str) -> None:
    """`openssl ARGS...` in `cwd`; its stderr is the failure message."""
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def make_pki(directory: Path) -> Path:
    """In `directory`: a CA (ca.crt/.key), a server certificate for 127.0.0.1 (server.crt/.key) and
    a client certificate (client.crt/.key) from it; and a client certificate from another CA
    (rogue.crt/.key, from other-ca)."""
    require_openssl()
    for ca in ("ca", "other-ca"):
        openssl(directory, "req", "-x509", *_EC_KEY, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-subj", f"/CN={ca}", "-days", "2")  # fmt: skip
    for name, ca, ext in (
        ("server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "ca", "extendedKeyUsage=clientAuth\n"),
        ("rogue", "other-ca", "extendedKeyUsage=clientAuth\n"),
    ):
        openssl(
            directory,
            "req",
            *_EC_KEY,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (directory / f"{name}.ext").write_text(ext)
        openssl(
            directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return directory


def self_signed(directory: Path, *, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for `host`, an IP address or a DNS name: (cert, key)."""
    require_openssl()
    return make_certificate(directory, host=host, name="cert", days=1)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server's TLS context presenting `cert`."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_context(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    """A client's TLS context trusting `make_pki`'s CA, presenting its certificate `cert` if named."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert is not None:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx
