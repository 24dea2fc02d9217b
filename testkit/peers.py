"""Where the Go test peers are: the programs `make peers` compiles from upstream Kubernetes code
(peers/, its own Go module) into .peers/bin.

The end-to-end tests (marker `e2e`, run by `make e2e`) call `peer(name)`: the binary's path, or,
when it was not built, a skip on a developer's machine and a FAILURE under `CI=true`, like
`testkit.tools.tool`.
"""

from __future__ import annotations

import os
from pathlib import Path

from testkit.tools import ON_CI

__all__ = ["PEERS_BIN", "peer", "require_root"]

ROOT = Path(__file__).resolve().parent.parent
PEERS_BIN = ROOT / ".peers" / "bin"


def peer(name: str) -> Path:
    """The built peer `name` (e.g. "kube-testcluster"); a missing one skips the calling test, or
    fails it under CI=true."""
    import pytest

    path = PEERS_BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        message = f"the Go test peer {name} is not built: run `make peers` (needs Go 1.26+)"
        if ON_CI:
            pytest.fail(f"{message} (under CI every test runs: a skip here would hide a lost test)")
        pytest.skip(message)
    return path


def require_root(why: str) -> None:
    """Root is needed (`why`): otherwise a skip on a developer's machine, a failure under CI=true."""
    import pytest

    if os.geteuid() != 0:
        message = f"needs root: {why}"
        if ON_CI:
            pytest.fail(f"{message} (under CI every test runs)")
        pytest.skip(message)
