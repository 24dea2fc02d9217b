"""Fake kubelets a test starts and never stops itself: the `start_kubelet` fixture (tests/conftest.py).

Most agent tests start one fake kubelet where `make_settings(root)` looks for it and stop it, its
socket removed, at the end; that is this factory's default. A test that scripts the fake before it
serves (a device added, one made unhealthy) or runs one as a context manager on purpose builds its
own `FakeKubelet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, Unpack

from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeNode
from watcher.sim.fake_plugins import Warmup

__all__ = ["KubeletOptions", "StartKubelet"]


class KubeletOptions(TypedDict, total=False):
    """FakeKubelet's keyword arguments, passed through as given (its defaults otherwise)."""

    rate: float
    burst: int
    seed: int | None
    shuffle: bool
    warmup: Warmup | None
    pods_api: bool
    node_name: str


class StartKubelet:
    """Start a FakeKubelet serving `node` (the built-in one by default) at `root` (default
    `base`/kubelet); every one started is stopped, its socket removed, by `stop_all`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[FakeKubelet] = []

    async def __call__(
        self, node: FakeNode | None = None, *, root: Path | None = None, **options: Unpack[KubeletOptions]
    ) -> FakeKubelet:
        fake = FakeKubelet(self.base / "kubelet" if root is None else root, node, **options)
        await fake.start()
        self.started.append(fake)
        return fake

    async def stop_all(self) -> None:
        # A fake the test stopped or restarted itself is stopped again harmlessly; its socket goes.
        while self.started:
            await self.started.pop().stop(remove_socket=True)
