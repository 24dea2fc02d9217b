"""The agent's one directory watch (watchfiles' Rust notifier), fanned out to its subscribers.

The kubelet replaces its socket on every start (unlink, listen on a temporary name, rename into
place), so DIRECTORIES are watched, never the socket file. Directory events are only a prompt: a
delete and a create may arrive in one batch, in any order, or not at all, so subscribers decide
with the file's identity (watcher.kubelet.identity) and use the events as evidence.

One inotify instance serves every directory the agent needs (the socket's, device-plugins/, the
kubelet root, the Pods API socket's): watchfiles' watch loop wakes every `step` to look at what
inotify queued, whether or not anything did, so each watch costs the same at idle and one costs a
quarter of four. The step is long while something else would tell of a kubelet restart at once
(the Pods API stream, live), short while a restart is awaited or nothing else would tell
(`hurry`): idle stays cheap and a new socket is still seen within tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog
import watchfiles
from watchfiles._rust_notify import RustNotify, WatchfilesRustInternalError

from watcher.supervision import StopFlag, StoppedError, sleep_or_stop, unless_stopped, wait_any

__all__ = ["Batch", "DirectoryWatches", "StopFlag", "Subscription"]

log = structlog.get_logger("watcher.kubelet.watching")

# name -> what happened to it: "added", "deleted", "modified". Empty: look again (the watch was
# (re)installed or interrupted, and what happened meanwhile may not have been reported).
Batch = dict[str, set[str]]


class Subscription:
    """What one consumer watches: the names in `directory` that `match`; batches are merged
    until read, so a consumer that reads late loses nothing and holds no queue."""

    def __init__(self, owner: DirectoryWatches, directory: Path, match: Callable[[str], bool], name: str):
        self.owner = owner
        self.directory = directory
        self.match = match
        self.name = name
        self._pending: Batch | None = None
        self._ready = asyncio.Event()
        self.waiting = False  # the directory is missing: its nearest existing parent is watched
        self.seen = False  # has looked since the watch was (re)made
        self.was_there = False

    def offer(self, batch: Batch) -> None:
        pending = self._pending if self._pending is not None else {}
        for name, kinds in batch.items():
            pending.setdefault(name, set()).update(kinds)
        self._pending = pending
        self._ready.set()

    def present(self) -> Batch:
        """The matching names already in the directory, as if just added."""
        try:
            return {p.name: {"added"} for p in self.directory.iterdir() if self.match(p.name)}
        except OSError:
            return {}

    def drain(self) -> None:
        """Forget what was offered and not read."""
        self._pending = None
        self._ready.clear()

    async def next(self) -> Batch:
        """The next batch (everything offered since the last one); waits for one."""
        await self._ready.wait()
        self._ready.clear()
        batch, self._pending = self._pending or {}, None
        return batch

    async def batches(self, until: StopFlag | None = None) -> AsyncGenerator[Batch, None]:
        """Batches until `until` (or the owner's stop flag) is set; unsubscribed when it ends."""
        flag = until if until is not None else self.owner.stop
        try:
            while not flag.is_set():
                try:
                    yield await unless_stopped(flag, self.next())
                except StoppedError:
                    return
        finally:
            self.close()

    def close(self) -> None:
        self.owner.unsubscribe(self)


class _Interrupt:
    """The stop flag watchfiles' loop looks at every step (in its thread): set to re-plan or to
    change the step, so a long step is cut short."""

    def __init__(self, stop: StopFlag) -> None:
        self.stop = stop
        self.wanted = False

    def is_set(self) -> bool:
        return self.wanted or self.stop.is_set()


class DirectoryWatches:
    """The one watch (`run()`, a supervised task) and its subscribers (`subscribe()`).

    - A missing directory: its nearest existing parent is watched until it appears (said once),
      then its matching names are offered as "added".
    - No inotify to be had (instance or watch limits): polling, with one warning.
    - A batch arrives one to two steps after a change (watchfiles confirms a batch when a step
      passes without more), at most `debounce_ms` after the first change of a burst.
    """

    def __init__(
        self,
        *,
        stop: StopFlag,
        step_ms: int = 100,
        hurry_step_ms: int = 10,
        debounce_ms: int = 30,
        force_polling: bool = False,
        poll_delay_ms: int = 100,
        look_ms: int = 10_000,
        hurry_look_ms: int = 1_000,
    ) -> None:
        self.stop = stop
        self.step_ms = step_ms
        self.hurry_step_ms = hurry_step_ms
        self.debounce_ms = debounce_ms
        self.polling = force_polling
        self.poll_delay_ms = poll_delay_ms
        # How long a call on the long (short) step waits for a change before the step is chosen again.
        self.look_ms, self.hurry_look_ms = look_ms, hurry_look_ms
        self.subscriptions: list[Subscription] = []
        self.installs = 0  # notifier instances made (one, unless directories came and went)
        self.stepping_ms: int | None = None  # the step of the look running now (None: none runs)
        self._hurry: set[str] = set()
        self._interrupt = _Interrupt(stop)
        self._changed = asyncio.Event()
        self._thread: ThreadPoolExecutor | None = None
        self._paths: list[Path] = []  # what the watch in place watches
        self._mtimes: dict[Path, int | None] = {}  # theirs when the last look began
        self._mtimes_at = 0  # when that was (ns, the wall clock mtimes are stamped on)

    # -- the subscribers' side --

    def subscribe(self, directory: Path, match: Callable[[str], bool], name: str) -> Subscription:
        sub = Subscription(self, directory, match, name)
        self.subscriptions.append(sub)
        self._replan()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self.subscriptions:
            self.subscriptions.remove(sub)
            self._replan()

    def hurry(self, reason: str, on: bool = True) -> None:
        """Step short while any reason holds (a restart awaited, nothing else to tell of one)."""
        before = bool(self._hurry)
        if on:
            self._hurry.add(reason)
        else:
            self._hurry.discard(reason)
        if bool(self._hurry) != before:
            # No interrupt: a call cut short drops what it gathered. The call running ends within
            # `look_ms` if nothing changes (at once if something does); a hurry meanwhile
            # is bridged by mtime looks (`_bridge`).
            self._changed.set()

    def hurrying(self, reason: str) -> bool:
        return reason in self._hurry

    def configure(self, *, step_ms: int, hurry_step_ms: int, force_polling: bool, poll_delay_ms: int) -> None:
        """New settings (a reload): the watch is made again on them."""
        self.step_ms, self.hurry_step_ms, self.poll_delay_ms = step_ms, hurry_step_ms, poll_delay_ms
        self.polling = self.polling or force_polling
        self._replan()

    @property
    def current_step_ms(self) -> int:
        return self.hurry_step_ms if self._hurry else self.step_ms

    def _replan(self) -> None:
        self._changed.set()
        plan = self._plan()
        if sorted(plan) != self._paths:
            self._interrupt.wanted = True  # another directory to watch: make the watch again
        elif self._paths:
            self._look_again(plan)  # already watched: a new subscriber looks once, now

    # -- the watch --

    def _plan(self) -> dict[Path, list[Subscription]]:
        """Each path to watch -> the subscribers it serves (its own, or those waiting for a child)."""
        plan: dict[Path, list[Subscription]] = {}
        for sub in self.subscriptions:
            path = sub.directory
            while not path.is_dir() and path != path.parent:
                path = path.parent
            plan.setdefault(path, []).append(sub)
        return plan

    def _look_again(self, plan: dict[Path, list[Subscription]]) -> None:
        """Log what is waited for, offer what appeared; every other subscriber looks again."""
        for path, subs in plan.items():
            for sub in subs:
                waiting = path != sub.directory
                if waiting and not sub.waiting:
                    sub.waiting = True
                    what = "directory does not exist, waiting for it"
                    if sub.was_there:
                        what = "directory vanished, waiting for it to come back"
                    log.warning(what, watch=sub.name, directory=str(sub.directory), watching=str(path))
                    sub.offer({})
                elif not waiting and sub.waiting:
                    sub.waiting = False
                    log.info("directory appeared", watch=sub.name, directory=str(sub.directory))
                    sub.offer(sub.present())
                elif not sub.seen:
                    sub.offer({})
                sub.seen = True
                sub.was_there = sub.was_there or not waiting

    def _make(self, paths: list[Path]) -> RustNotify:
        return RustNotify(
            [str(p) for p in paths],
            False,  # debug
            self.polling,
            self.poll_delay_ms,
            False,  # recursive: the directories' own entries are all we look at
            True,  # ignore_permission_denied (it also skips missing paths: the plan is checked after)
        )

    async def _install(self, paths: list[Path], names: list[str]) -> RustNotify | None:
        """The notifier for `paths`, falling back to polling when inotify is not to be had."""
        while not self.stop.is_set():
            try:
                return self._make(paths)
            except FileNotFoundError:
                return None  # a directory went meanwhile: plan again
            except (WatchfilesRustInternalError, OSError) as err:
                if self.polling or not _is_limit_error(err):
                    # Unknown trouble: say so, wait a little, try again; never crash the agent.
                    log.error("directory watch failed; retrying", error=str(err), watches=names)
                    await sleep_or_stop(self.stop, 1.0)
                    return None
                self.polling = True
                log.warning(
                    "inotify limits exhausted, falling back to polling",
                    error=str(err),
                    watch="directories",
                    watches=names,
                    poll_ms=self.poll_delay_ms,
                    hint="raise fs.inotify.max_user_instances / max_user_watches on the node",
                )
        return None

    async def run(self) -> None:
        """Watch until the stop flag; made again when the directories to watch change."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="directory-watch")
        try:
            while not self.stop.is_set():
                self._changed.clear()
                self._interrupt.wanted = False
                plan = self._plan()
                self._paths = sorted(plan)
                if not plan:
                    await wait_any(self._changed, self.stop)
                    continue
                names = sorted({s.name for subs in plan.values() for s in subs})
                notify = await self._install(self._paths, names)
                if notify is None:
                    continue
                self.installs += 1
                with notify:
                    if sorted(self._plan()) != self._paths:
                        continue  # a directory came or went while it was being made
                    if self.installs > 1:  # made again: what changed meanwhile went unreported
                        self._offer_moved()
                        for sub in self.subscriptions:
                            sub.seen = False
                    self._look_again(plan)
                    await self._watch(notify)
        finally:
            self._thread.shutdown(wait=False)
            self._thread = None
            self._paths, self._mtimes = [], {}

    async def _watch(self, notify: RustNotify) -> None:
        """Route batches until the directories to watch change (or the stop flag)."""
        while not self.stop.is_set():
            self._mtimes, self._mtimes_at = _mtimes(self._paths), time.time_ns()
            self.stepping_ms = self.current_step_ms
            try:
                result = await self._call(notify, self.stepping_ms)
            finally:
                self.stepping_ms = None
            if result == "stop" and not self.stop.is_set():
                # Cut short (a new step, or directories to re-plan): what it gathered was dropped.
                self._interrupt.wanted = False
                self._offer_moved()
            elif result == "timeout" and not self.polling:
                # Nothing gathered, but watchfiles clears its set as it times out: a change in
                # that instant would be lost. The mtimes tell (it would be a second after the
                # call began: no need to count recent ones, which the last batch reported).
                self._offer_moved(recent=False)
            plan = self._plan()
            if sorted(plan) != self._paths:
                return  # a waited-for directory appeared, or a watched one went
            self._changed.clear()
            self._look_again(plan)  # new subscribers look once
            if result == "timeout" and self.polling:  # polling misses a file replaced in place
                for sub in self.subscriptions:
                    sub.offer({})
            elif isinstance(result, set):  # not "signal": never in this thread
                self._route(result)

    def _offer_moved(self, *, recent: bool = True) -> None:
        """Subscribers of a directory whose mtime moved since `_mtimes` get its names again: what
        happened there meanwhile may not have been reported (a call cut short, a watch made again)."""
        now = _mtimes(list(self._mtimes))
        # The kernel stamps mtimes from a coarse clock (a few ms): a change in the same tick as the
        # look began leaves the mtime as it was. So a directory changed that recently counts as
        # moved too: a needless look costs a re-query, a missed one a change until the timer.
        since = self._mtimes_at - _COARSE_NS if recent else math.inf
        for sub in self.subscriptions:
            path = sub.directory
            if sub.waiting or path not in now:
                continue
            mtime = now[path]
            if mtime != self._mtimes[path] or (mtime is not None and mtime >= since):
                sub.offer({name: {"modified"} for name in sub.present()})
        self._mtimes.update(now)

    def _route(self, changes: set[tuple[int, str]]) -> None:
        routed: dict[int, tuple[Subscription, Batch]] = {}
        for change, raw in changes:
            p = Path(raw)
            for sub in self.subscriptions:
                if sub.directory == p.parent and sub.match(p.name):
                    batch = routed.setdefault(id(sub), (sub, {}))[1]
                    batch.setdefault(p.name, set()).add(watchfiles.Change(change).name)
        for sub, batch in routed.values():
            sub.offer(batch)

    async def _call(self, notify: RustNotify, step: int) -> object:
        assert self._thread is not None
        # Polling misses what inotify reports (a socket replaced in place keeps its mtime to the
        # second): there, subscribers look again every second at least. With inotify a call ends
        # after a while without changes too (dropping nothing), so a new step takes over: without
        # a timeout it would keep its step until some change, at idle perhaps never (ten times the
        # CPU after a hurry). Each end wakes the event loop; a hurry is bridged meanwhile.
        if self.polling:
            timeout = max(self.hurry_look_ms, self.poll_delay_ms)
        else:
            timeout = self.hurry_look_ms if step < self.step_ms else self.look_ms
        future = self._thread.submit(notify.watch, self.debounce_ms, step, timeout, self._interrupt)
        bridge = asyncio.create_task(self._bridge(step))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The thread still holds the notifier: let it see the flag before the notifier closes.
            self._interrupt.wanted = True
            with contextlib.suppress(BaseException):
                await asyncio.wrap_future(future)
            raise
        finally:
            bridge.cancel()
            await asyncio.gather(bridge, return_exceptions=True)

    async def _bridge(self, step: int) -> None:
        """While a long-step call runs out after a hurry: look at the directories' mtimes on short
        steps, so a socket that appears meanwhile is not seen a long step late."""
        while not (self._hurry and self.hurry_step_ms < step):
            await wait_any(self._changed, self.stop)  # set by hurry() too
            if self.stop.is_set():
                return
            self._changed.clear()
        seen = dict(self._mtimes)  # as the call began: a change since is not yet reported
        while True:
            await asyncio.sleep(self.hurry_step_ms / 1000)
            now = _mtimes(self._paths)
            for path, subs in self._plan().items():
                if now.get(path) != seen.get(path):
                    for sub in subs:  # "modified": a look proves no name event
                        sub.offer({} if sub.waiting else {n: {"modified"} for n in sub.present()})
            seen = now


# More than the kernel's coarse clock tick (1-10 ms, by CONFIG_HZ), with room for a busy machine.
_COARSE_NS = 50_000_000


def _mtimes(paths: list[Path]) -> dict[Path, int | None]:
    out: dict[Path, int | None] = {}
    for path in paths:
        try:
            out[path] = os.stat(path).st_mtime_ns
        except OSError:
            out[path] = None
    return out


def _is_limit_error(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOSPC):
        return True
    text = str(err).lower()
    return any(
        s in text
        for s in ("too many open files", "no space left", "watch limit", "os error 24", "os error 28")
    )
