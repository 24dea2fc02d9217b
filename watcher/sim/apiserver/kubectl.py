"""The real kubectl, run against the fake API server from the loop that serves it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

__all__ = ["kubectl"]


async def kubectl(
    kubeconfig: str | os.PathLike[str], *args: str, deadline: float = 20.0
) -> tuple[int, str, str]:
    """Run the real kubectl against the kubeconfig's server without blocking the event loop (the
    server answers on it), its discovery cache beside the kubeconfig; killed after `deadline` seconds."""
    config = Path(kubeconfig)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(config.parent),
        "KUBECONFIG": str(config),
    }
    proc = await asyncio.create_subprocess_exec(
        shutil.which("kubectl", path=env["PATH"]) or "kubectl",
        "--kubeconfig", str(config),
        "--cache-dir", str(config.parent / "kubectl-cache"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
