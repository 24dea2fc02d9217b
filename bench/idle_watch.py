"""What one idle directory watch costs: watchfiles' `awatch` on an empty directory, nothing
changing, at the agent's step (10 ms) and at 100 ms, side by side in one run.

watchfiles' watch loop (in its worker thread) wakes every `step` milliseconds to look for changes
and at the stop flag, whether or not anything changed; the agent keeps one such watch for every
directory (watcher/kubelet/watching.py), at `[watch] step` while the Pods API stream is live and
`[watch] hurry_step` otherwise. This is the floor under the agent's steady-state CPU share
(section 3 of BENCHMARKS.md; its idle curve measures the whole agent at several steps).

    .venv/bin/python bench/idle_watch.py
"""

from __future__ import annotations

import asyncio
import tempfile
import time

import watchfiles

__all__ = ["idle_watch_cpu"]

WINDOW_S = 10.0


async def idle_watch_cpu(step_ms: int, window_s: float = WINDOW_S) -> float:
    """Process CPU seconds over `window_s` with one idle watch at `step_ms`."""
    with tempfile.TemporaryDirectory() as directory:
        stop = asyncio.Event()

        async def watch() -> None:
            async for _ in watchfiles.awatch(
                directory,
                step=step_ms,
                debounce=30,
                stop_event=stop,
                rust_timeout=1000,
                yield_on_timeout=True,
            ):
                pass

        task = asyncio.create_task(watch())
        await asyncio.sleep(1.0)  # the watch is running
        before = time.process_time()
        await asyncio.sleep(window_s)
        spent = time.process_time() - before
        stop.set()
        await task
    return spent


def main() -> None:
    for step_ms in (10, 100):
        cpu = asyncio.run(idle_watch_cpu(step_ms))
        print(
            f"one idle watch, step {step_ms} ms: {cpu:.3f} s CPU over {WINDOW_S:g} s = {cpu / WINDOW_S:.3%} of one core"
        )


if __name__ == "__main__":
    main()
