"""What a process pays at rest for the two things the agent keeps open, each alone: section 3 runs
them beside the agent, in the same window, as its baselines.

    python bench/idle_floor.py grpc SOCKET [PODS_SOCKET]
        # one grpc.aio channel, one call made, then idle; with PODS_SOCKET also the Pods API's
        # watch stream held open on a second channel, reading what it sends (as the agent does)
    python bench/idle_floor.py watch DIR STEP_MS  # watchfiles' watch of DIR, called as ours is

`grpc`: gRPC's threads (its event engine's pool, timer and lifeguard) live while any channel is
open and wake on their own, whatever the channel does; an open stream makes them wake more. `watch`: watchfiles wakes every STEP_MS
to look at what inotify queued, found or not, and asks its stop flag each time (a Python call,
as the agent's `[watch] step` does). Each prints "ready" once set up and runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _Never:
    """A stop flag that is never set: asked every step, as the agent's is."""

    def is_set(self) -> bool:
        return False


async def _grpc(socket: str, pods_socket: str | None) -> None:
    from watcher import errors
    from watcher.kubelet.client import PodResourcesClient
    from watcher.sources.pods_api.client import PodsApiClient

    client = PodResourcesClient(socket)
    await client.allocatable_raw()
    if pods_socket is None:
        print("ready", flush=True)
        await asyncio.Event().wait()
        return
    announced = False
    for _ in range(60):  # a kubelet still warming up refuses the watch for a moment
        try:
            async for _kind, _pod in PodsApiClient(pods_socket, timeout=10.0).watch():
                if not announced:  # the snapshot is coming: the stream is open
                    print("ready", flush=True)
                    announced = True
        except errors.KubeletError:
            await asyncio.sleep(0.5)
    raise SystemExit("the Pods API's watch did not stay open")


def _watch(directory: str, step_ms: int) -> None:
    from watchfiles._rust_notify import RustNotify

    notify = RustNotify([directory], False, False, 300, False, True)
    print("ready", flush=True)
    flag = _Never()
    while True:
        notify.watch(30, step_ms, 10_000, flag)  # the agent's debounce and long-step timeout


def main() -> None:
    kind, *args = sys.argv[1:]
    if kind == "grpc":
        asyncio.run(_grpc(args[0], args[1] if len(args) > 1 else None))
    elif kind == "watch":
        _watch(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown floor {kind!r}: grpc or watch")


if __name__ == "__main__":
    main()
