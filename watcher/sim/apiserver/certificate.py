"""The fake API server's serving certificate: self-signed for 127.0.0.1 (kubectl sends a bearer
token only over TLS, and verifies the server against the kubeconfig's CA)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["make_certificate"]


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) by the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make the fake API server's certificate")
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=fake-apiserver",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key
