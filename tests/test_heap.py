"""watcher.heap: the node's long-lived view is left out of the GC's full passes, and what it froze
is still collected once it becomes garbage, at the next settle."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher import heap


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


class _Node:
    me: _Node


def test_a_settled_object_is_skipped_by_full_passes_and_collected_at_the_next_settle() -> None:
    node = _Node()
    node.me = node  # a reference cycle: only the cyclic collector can free it
    alive = weakref.ref(node)
    heap.settle("test")
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert alive() is not None  # frozen: a full pass does not look at it
    heap.settle("test")
    assert alive() is None


def test_what_settle_leaves_is_still_freed_by_reference_counting() -> None:
    node = _Node()
    alive = weakref.ref(node)
    heap.settle("test")
    del node  # no cycle: freed at once, frozen or not
    assert alive() is None


async def test_the_agent_settles_its_first_inventory_and_each_pods_api_snapshot(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    fake = await start_kubelet(seed=3)
    settles: list[str] = []
    real = heap.settle

    def counted(reason: str) -> None:
        settles.append(reason)
        real(reason)

    # The two callers look the function up in the module, so counting it there sees both.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "settle", counted)
        async with running_agent(make_settings(short_tmp, interval=3600.0), fake) as run:
            watch = run.agent.pods_watch
            assert watch is not None
            await run.recorder.until(lambda: watch.state == "watching" and len(settles) >= 2, 10)
            assert gc.get_freeze_count() > 0
            assert sorted(settles) == ["the Pods API's snapshot", "the first inventory"]
