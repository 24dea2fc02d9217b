"""A child process whose output lines are stamped on arrival (time.monotonic()), for measuring the
time from a change to what each tool prints about it: our agent's stdout sink, nfd's klog lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from testkit.changes import Changes
from testkit.peer_process import terminate

__all__ = ["StampedProcess", "rss_mib"]


def rss_mib(pid: int) -> float:
    """The resident set of process `pid` (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


class StampedProcess:
    """`argv` with one stream (`stdout` or `stderr`) read line by line, each line kept with the
    monotonic time it arrived; the other stream goes to `log`."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        stream: str = "stdout",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.stream = stream
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.lines: list[tuple[float, str]] = []
        self.changes = Changes()
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    async def start(self) -> None:
        pipe, other = asyncio.subprocess.PIPE, self.log.open("ab")
        with other:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=pipe if self.stream == "stdout" else other,
                stderr=pipe if self.stream == "stderr" else other,
                env=self.env,
                cwd=self.cwd,
            )
        source = self._proc.stdout if self.stream == "stdout" else self._proc.stderr
        assert source is not None
        self._reader = asyncio.create_task(self._read(source), name=f"stamped-{Path(self.argv[0]).name}")

    async def _read(self, source: asyncio.StreamReader) -> None:
        while line := await source.readline():
            self.lines.append((time.monotonic(), line.decode(errors="replace").rstrip("\n")))
            self.changes.notify()
        self.changes.notify()  # EOF: the process is ending

    def _alive(self) -> None:
        if self._proc is None or (self._reader is not None and self._reader.done()):
            tail = "\n".join(line for _, line in self.lines[-20:])
            raise RuntimeError(f"{self.argv[0]} exited; its {self.stream} ends:\n{tail}")

    def exited(self) -> bool:
        return (
            self._proc is None
            or self._proc.returncode is not None
            or bool(self._reader and self._reader.done())
        )

    async def until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `predicate()` holds (checked after each line); RuntimeError if the process ends,
        AssertionError naming `what` after `timeout` s."""
        await self.changes.until(
            predicate, timeout, check=self._alive, describe=lambda: f"{what}: not seen in {timeout:g} s"
        )

    async def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        await terminate(proc)
        if self._reader is not None:
            await self._reader
