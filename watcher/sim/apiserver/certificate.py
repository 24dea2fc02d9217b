"""A self-signed serving certificate by the openssl command: the fake API server's (kubectl sends a
bearer token only over TLS, and verifies the server against the kubeconfig's CA), and the tests'
(testkit.certificates uses this one rather than a copy)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["make_certificate"]


def make_certificate(
    directory: Path, *, host: str = "127.0.0.1", name: str = "apiserver", days: int = 2
) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for `host`, an IP address or a DNS name, as
    DIRECTORY/NAME.crt and NAME.key: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make the fake API server's certificate")
    san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", str(days), "-subj", f"/CN={host}",
            "-addext", f"subjectAltName={san}", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key
