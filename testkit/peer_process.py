"""A Go test peer as a child process: its stdout lines collected as they arrive (to await: the
peers announce readiness there), its stderr in a log file, stopped with SIGTERM (SIGKILL if it
hangs)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from testkit.changes import Changes

__all__ = ["PeerProcess", "terminate"]


class PeerProcess:
    """One child process: its stdout lines collected as they come (to await), stderr to a log."""

    def __init__(self, argv: Sequence[str], log: Path, *, stdin: bool = False) -> None:
        self.argv = list(argv)
        self.log = log
        self.stdin = stdin
        self.lines: list[str] = []
        self.changes = Changes()
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE if self.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        self._reader = asyncio.create_task(self._read(self._proc), name=f"peer-{Path(self.argv[0]).name}")

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            self.lines.append(line.decode().rstrip("\n"))
            self.changes.notify()
        self.changes.notify()  # EOF: the process is ending

    def _alive(self) -> None:
        if self._proc is None or (self._reader is not None and self._reader.done()):
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise AssertionError(f"{self.argv[0]} exited; its log ends:\n{tail}")

    async def until(self, predicate: Callable[[list[str]], bool], timeout: float = 15.0) -> None:
        await self.changes.until(
            lambda: predicate(self.lines),
            timeout,
            check=self._alive,
            describe=lambda: f"{self.argv[0]}: not seen on stdout in {timeout:g} s; got {self.lines[-5:]}",
        )

    async def send(self, line: str) -> None:
        assert self._proc is not None
        assert self._proc.stdin is not None
        self._proc.stdin.write(line.encode() + b"\n")
        await self._proc.stdin.drain()

    def pause(self) -> None:
        """SIGSTOP: the process does nothing until `resume` (a slow peer, on purpose)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up; reaped; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if self._reader is not None:
            await self._reader

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited within 10 s; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        await terminate(proc)
        if self._reader is not None:
            await self._reader


async def terminate(proc: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `grace` seconds; then reaped."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
