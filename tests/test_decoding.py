"""The incremental decoder: the same inventories as a full build, rebuilding only what changed.

Properties reuse the random nodes and renderings of test_inventory_properties (every repeated
field shuffled, entries split and regrouped, pods listed in several entries); the examples use the
fake kubelet's own answers, so the bytes are what the agent really receives.
"""

from __future__ import annotations

import gc
import json
import random
import sys

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import given
from hypothesis import strategies as st

from testkit.node_model import FAST, MContainer, Model, models
from testkit.node_mutations import MUTATIONS
from testkit.node_rendering import render, render_claim_resource, shuffled
from watcher.kubelet.decoding import Decoder, Outcome
from watcher.kubeletapi.v1 import api_pb2
from watcher.model.build import build
from watcher.model.inventory import Inventory, changed_pods
from watcher.model.restore import from_canonical
from watcher.model.tally import Tally
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import FakeContainer, FakeMemory, FakePod, default_node, large_node


def _kubelet_render(model: Model, rng: random.Random) -> tuple[bytes | None, bytes]:
    """The node as a kubelet sends it: one entry per device per NUMA node, per memory block, per
    container and per pod, every repeated field in random order (Go maps), nothing split."""

    def devices(devs: dict[tuple[str, str], tuple[int, ...]]) -> list[api_pb2.ContainerDevices]:
        out = []
        for (resource, dev_id), numa in devs.items():
            if not numa:
                out.append(api_pb2.ContainerDevices(resource_name=resource, device_ids=[dev_id]))
            for n in numa:
                topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n)])
                out.append(
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=[dev_id], topology=topology)
                )
        return shuffled(rng, out)

    def memory(blocks: dict[tuple[str, tuple[int, ...]], int]) -> list[api_pb2.ContainerMemory]:
        return shuffled(
            rng,
            [
                api_pb2.ContainerMemory(
                    memory_type=t,
                    size=size,
                    topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa]),
                )
                for (t, numa), size in blocks.items()
            ],
        )

    def claims(c: MContainer) -> list[api_pb2.DynamicResource]:
        return shuffled(
            rng,
            [
                api_pb2.DynamicResource(
                    claim_namespace=ns,
                    claim_name=name,
                    claim_resources=[render_claim_resource(rng, d) for d in sorted(devs, key=repr)],
                )
                for (ns, name), devs in c.claims.items()
            ],
        )

    alloc = None
    if model.known:
        alloc = api_pb2.AllocatableResourcesResponse(
            devices=devices(model.devices),
            cpu_ids=shuffled(rng, model.cpu_ids),
            memory=memory(model.memory),
        ).SerializeToString()
    pods = [
        api_pb2.PodResources(
            namespace=ns,
            name=name,
            containers=shuffled(
                rng,
                [
                    api_pb2.ContainerResources(
                        name=cname,
                        devices=devices(c.devices),
                        cpu_ids=shuffled(rng, c.cpu_ids),
                        memory=memory(c.memory),
                        dynamic_resources=claims(c),
                    )
                    for cname, c in p.containers.items()
                ],
            ),
            cpu_ids=shuffled(rng, p.cpu_ids),
            memory=memory(p.memory),
        )
        for (ns, name), p in model.pods.items()
    ]
    return alloc, api_pb2.ListPodResourcesResponse(pod_resources=shuffled(rng, pods)).SerializeToString()


def _wire(model: Model, rng: random.Random) -> tuple[bytes | None, bytes]:
    """Mostly as a kubelet sends it; sometimes split and regrouped every way the model allows."""
    if rng.random() < 0.8:
        return _kubelet_render(model, rng)
    alloc, lst = render(model, rng)
    return (alloc.SerializeToString() if alloc is not None else None), lst.SerializeToString()


def _full(alloc: bytes | None, lst: bytes) -> Inventory:
    return build(
        api_pb2.AllocatableResourcesResponse.FromString(alloc) if alloc is not None else None,
        api_pb2.ListPodResourcesResponse.FromString(lst),
    )


def _answers(fake: FakeKubelet) -> tuple[bytes, bytes]:
    return fake.allocatable_response().SerializeToString(), fake.list_response().SerializeToString()


@FAST
@given(
    model=models(),
    rng=st.randoms(use_true_random=True),
    steps=st.lists(st.integers(0, len(MUTATIONS)), max_size=8),
)
def test_every_answer_decodes_to_what_a_full_build_gives(
    model: Model, rng: random.Random, steps: list[int]
) -> None:
    decoder = Decoder()
    last: Inventory | None = None
    for step in [len(MUTATIONS), *steps]:
        # Change the node by one mutation (when it applies), or only render it anew:
        # another order, other splits.
        changed = MUTATIONS[step](model) if step < len(MUTATIONS) else None
        if changed is not None:
            model = changed
        wire = _wire(model, random.Random(rng.getrandbits(64)))
        got, outcome = decoder.decode(*wire)
        want = _full(*wire)
        assert got == want
        assert got.content_hash == want.content_hash
        assert got.canonical_bytes == want.canonical_bytes
        if last is not None and want == last:
            assert got is last, "the same node must come back as the same object"
            assert outcome is not Outcome.CHANGED
        elif last is not None:
            assert outcome is Outcome.CHANGED
        last = got


def test_a_reordered_large_node_rebuilds_nothing() -> None:
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    decoder = Decoder()
    first, outcome = decoder.decode(*_answers(fake))
    assert outcome is Outcome.CHANGED
    assert decoder.stats.pods_rebuilt == 250
    for _ in range(20):
        answers = _answers(fake)
        again, outcome = decoder.decode(*answers)
        assert again is first
        assert outcome is Outcome.REORDERED
    assert decoder.stats.pods_rebuilt == 250
    assert decoder.stats.allocatable_rebuilt == 1
    same, outcome = decoder.decode(*answers)
    assert (same, outcome) == (first, Outcome.SAME_BYTES)


def test_a_device_health_flip_rebuilds_the_allocatable_side_only() -> None:
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    decoder = Decoder()
    before, _ = decoder.decode(*_answers(fake))
    fake.make_unhealthy("vendor0.example.com/dev", "dev-0-5")
    after, outcome = decoder.decode(*_answers(fake))
    assert outcome is Outcome.CHANGED
    assert after == _full(*_answers(fake))
    assert ("vendor0.example.com/dev", "dev-0-5") not in {(d.resource, d.id) for d in after.devices}
    assert decoder.stats.pods_rebuilt == 250
    assert decoder.stats.allocatable_rebuilt == 2
    assert all(a is b for a, b in zip(after.pods, before.pods, strict=True))  # carried over as they were


def test_an_allocation_change_rebuilds_that_pod_only() -> None:
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    decoder = Decoder()
    before, _ = decoder.decode(*_answers(fake))
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    fake.free("ns-4", "pod-4")
    fake.add_pod(FakePod("ns-0", "pod-new", [FakeContainer("main", cpu_ids={301})]))
    after, outcome = decoder.decode(*_answers(fake))
    assert outcome is Outcome.CHANGED
    assert after == _full(*_answers(fake))
    assert decoder.stats.pods_rebuilt == 250 + 2  # pod-3 and pod-new
    assert decoder.stats.allocatable_rebuilt == 1
    reused = {p.key for p in after.pods} & {p.key for p in before.pods}
    old = {p.key: p for p in before.pods}
    assert [p.key for p in after.pods if p.key in reused and p is not old[p.key]] == ["ns-3/pod-3"]


def test_entries_reordered_inside_a_container_are_no_change() -> None:
    # The default node's trainer holds 16 CPUs and 4 GPUs: its bytes differ on every call.
    fake = FakeKubelet("/nonexistent", default_node(), seed=3)
    decoder = Decoder()
    first, _ = decoder.decode(*_answers(fake))
    rebuilt = decoder.stats.pods_rebuilt
    for _ in range(10):
        again, outcome = decoder.decode(*_answers(fake))
        assert again is first
        assert outcome is Outcome.REORDERED
    assert decoder.stats.pods_rebuilt == rebuilt


def test_a_pod_listed_twice_is_merged_as_a_full_build_would() -> None:
    fake = FakeKubelet("/nonexistent", default_node(), seed=3)
    alloc, lst = _answers(fake)
    answer = api_pb2.ListPodResourcesResponse.FromString(lst)
    pod = answer.pod_resources[0]
    answer.pod_resources.append(
        api_pb2.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[api_pb2.ContainerResources(name="extra", cpu_ids=[95])],
        )
    )
    doubled = answer.SerializeToString()
    decoder = Decoder()
    decoder.decode(alloc, lst)
    got, outcome = decoder.decode(alloc, doubled)
    assert outcome is Outcome.CHANGED
    assert got == _full(alloc, doubled)
    assert "extra" in {c.name for p in got.pods if p.name == pod.name for c in p.containers}
    back, outcome = decoder.decode(alloc, lst)
    assert back == _full(alloc, lst)
    assert outcome is Outcome.CHANGED


def test_list_only_answers_and_back() -> None:
    fake = FakeKubelet("/nonexistent", default_node(), seed=3)
    decoder = Decoder()
    alloc, lst = _answers(fake)
    full, _ = decoder.decode(alloc, lst)
    only, outcome = decoder.decode(None, lst)
    assert outcome is Outcome.CHANGED
    assert not only.allocatable_known
    assert only == _full(None, lst)
    assert only.pods is not full.pods and only.pods == full.pods
    again, outcome = decoder.decode(alloc, lst)
    assert outcome is Outcome.CHANGED
    assert again == full


@pytest.mark.parametrize("which", ["allocatable", "list", "inner"])
def test_bytes_that_do_not_parse_raise_and_leave_the_decoder_as_it_was(which: str) -> None:
    fake = FakeKubelet("/nonexistent", default_node(), seed=3)
    fake.add_pod(FakePod("x", "y", [FakeContainer("c", memory=[FakeMemory("memory", 1)])]))
    decoder = Decoder()
    alloc, lst = _answers(fake)
    first, _ = decoder.decode(alloc, lst)
    garbage = b"\xff\xff\xff"
    if which == "allocatable":
        bad: tuple[bytes | None, bytes] = (garbage, lst)
    elif which == "list":
        bad = (alloc, garbage)
    else:
        # Parses as a view (the memory entry is only bytes there) but not as a real answer.
        broken = api_pb2.ListPodResourcesResponse.FromString(lst)
        for p in broken.pod_resources:
            if p.name == "y":
                p.containers[0].memory[0].memory_type = "memory-x"
        raw = broken.SerializeToString()
        bad = (alloc, raw.replace(b"memory-x", b"memory\xff\xfe"))
    with pytest.raises(DecodeError):
        decoder.decode(*bad)
    again, outcome = decoder.decode(*_answers(fake))
    assert (again, outcome) == (first, Outcome.REORDERED)


def test_an_allocatable_side_refused_after_the_pods_were_walked_leaves_the_decoder_as_it_was() -> None:
    # A device id that is not UTF-8 parses as a view, not as the answer: the pods are walked before
    # it is refused. The answer then decoded with the id made valid (as the repair does; the same
    # allocatable side as the last one) must show every change: remembered from the refused walk, a
    # new or changed pod was taken as seen, and a pod whose memory it renewed as gone.
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    fake.add_device("nvidia.com/gpu", "GPU-evil", (0,))

    def answers() -> tuple[bytes, bytes, bytes]:
        alloc, lst = _answers(fake)
        return alloc.replace(b"GPU-evil", b"GPU\xffevil"), alloc.replace(b"GPU-evil", b"GPU_evil"), lst

    decoder = Decoder()
    _, valid, lst = answers()
    decoder.decode(valid, lst)
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    fake.free("ns-4", "pod-4")
    fake.add_pod(FakePod("ns-0", "pod-new", [FakeContainer("main", cpu_ids={301})]))
    invalid, valid, lst = answers()
    with pytest.raises(DecodeError):
        decoder.decode(invalid, lst)
    after, outcome = decoder.decode(valid, lst)
    assert outcome is Outcome.CHANGED
    assert after == _full(valid, lst)


def test_after_a_pod_listed_twice_its_disappearance_is_still_seen() -> None:
    # Found by the property above: a full build (a pod listed twice) kept no keys, and an
    # empty key set then compared equal to the next answer's.
    alone = api_pb2.PodResources(name="p", namespace="ns", containers=[api_pb2.ContainerResources(name="c")])
    doubled = api_pb2.ListPodResourcesResponse(pod_resources=[alone, alone]).SerializeToString()
    empty = api_pb2.ListPodResourcesResponse().SerializeToString()
    decoder = Decoder()
    first, _ = decoder.decode(None, doubled)
    assert [p.name for p in first.pods] == ["p"]
    gone, outcome = decoder.decode(None, empty)
    assert outcome is Outcome.CHANGED
    assert gone.pods == ()


def _protobuf_messages() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Message))


def test_the_decoder_keeps_neither_the_answers_nor_their_parse() -> None:
    """What it remembers between answers is digests and the model: not the answers' bytes (as it
    did to spot byte-identical answers) and no parsed message. Protobuf's messages take no weak
    references, so the bytes' reference counts and the live messages are counted instead."""
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    decoder = Decoder()
    messages = _protobuf_messages()
    answers = []
    for step in range(4):  # first, reordered, changed (one pod), the same bytes again
        if step == 2:
            fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
        alloc, lst = answers[-1] if step == 3 else _answers(fake)
        held = sys.getrefcount(alloc), sys.getrefcount(lst)
        decoder.decode(alloc, lst)
        assert (sys.getrefcount(alloc), sys.getrefcount(lst)) == held
        assert _protobuf_messages() == messages
        answers.append((alloc, lst))
    assert decoder.stats.same_bytes == 1 and decoder.stats.reordered == 1 and decoder.stats.changed == 2


def test_a_seeded_decoder_takes_the_saved_pods_as_they_are() -> None:
    """After a restart the decoder starts from the saved inventory: an answer with the same node
    gives that very object back, and a changed pod alone is new."""
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    saved = from_canonical(json.loads(_full(*_answers(fake)).canonical_bytes))  # as loaded from disk
    decoder = Decoder()
    decoder.seed(saved)
    got, outcome = decoder.decode(*_answers(fake))
    assert got is saved and outcome is Outcome.REORDERED
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    after, outcome = decoder.decode(*_answers(fake))
    assert outcome is Outcome.CHANGED and after == _full(*_answers(fake))
    assert [p.key for p in after.pods if not any(p is q for q in saved.pods)] == ["ns-3/pod-3"]


def _entry(pod: bytes) -> bytes:
    """One pod as a List answer's repeated field 1 holds it: tag, length (a varint), bytes."""
    size, head = len(pod), bytearray(b"\x0a")
    while size > 0x7F:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + pod


@FAST
@given(
    model=models(),
    rng=st.randoms(use_true_random=True),
    steps=st.lists(st.integers(0, len(MUTATIONS)), max_size=8),
)
def test_pods_whose_bytes_repeat_decode_to_what_a_full_build_gives(
    model: Model, rng: random.Random, steps: list[int]
) -> None:
    """As a kubelet that lists each pod's entries in a stable order sends it: a pod the node did
    not change comes back as the very bytes it had (the decoder's unparsed fast path), a changed
    one anew, the pods in a fresh order; now and then one pod left out (back in the next answer as
    it was) or one listed twice, byte for byte. Each
    answer must still be what a full build gives, tally included (carried over, not recounted)."""
    decoder = Decoder()
    kept: dict[tuple[str, str], tuple[object, bytes]] = {}  # pod -> (its model, its bytes)
    last: Inventory | None = None
    for step in [len(MUTATIONS), *steps, len(MUTATIONS)]:
        changed = MUTATIONS[step](model) if step < len(MUTATIONS) else None
        if changed is not None:
            model = changed
        alloc, lst = _kubelet_render(model, random.Random(rng.getrandbits(64)))
        fresh = {
            (p.namespace, p.name): p.SerializeToString()
            for p in api_pb2.ListPodResourcesResponse.FromString(lst).pod_resources
        }
        pods = []
        for key, pod in fresh.items():
            was = kept.get(key)
            pods.append(was[1] if was is not None and was[0] == model.pods[key] else pod)
            kept[key] = (model.pods[key], pods[-1])
        if pods and rng.random() < 0.25:  # one left out of this answer, back in the next as it was
            pods.remove(rng.choice(pods))
        if pods and rng.random() < 0.15:
            pods.append(rng.choice(pods))
        rng.shuffle(pods)
        wire = (alloc, b"".join(_entry(p) for p in pods))
        got, outcome = decoder.decode(*wire)
        want = _full(*wire)
        assert got == want
        assert got.content_hash == want.content_hash
        assert got.tally == Tally.of(want.pods)
        if last is not None and want == last:
            assert got is last, "the same node must come back as the same object"
            assert outcome is not Outcome.CHANGED
        elif last is not None:
            assert outcome is Outcome.CHANGED
        last = got


def test_pods_whose_bytes_repeat_are_not_parsed_and_one_change_moves_one_pod() -> None:
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    fake.shuffle = False  # each pod's entries in a stable order, as the kubelet lists them
    decoder = Decoder()
    alloc, lst = _answers(fake)
    pods = [p.SerializeToString() for p in api_pb2.ListPodResourcesResponse.FromString(lst).pod_resources]
    first, _ = decoder.decode(alloc, lst)
    assert decoder.stats.pods_parsed == 250
    random.Random(3).shuffle(pods)
    again, outcome = decoder.decode(alloc, b"".join(_entry(p) for p in pods))
    assert (again, outcome) == (first, Outcome.REORDERED)
    assert decoder.stats.pods_parsed == 250, "a pod whose bytes repeat is not parsed"
    fake.allocate("ns-3", "pod-3", "c2", cpu_ids=[300])
    alloc, lst = _answers(fake)
    after, outcome = decoder.decode(alloc, lst)
    assert outcome is Outcome.CHANGED
    assert after == _full(alloc, lst)
    assert (decoder.stats.pods_parsed, decoder.stats.pods_rebuilt) == (251, 251)
    gone, came = changed_pods(first, after)
    assert [p.key for p in gone] == [p.key for p in came] == ["ns-3/pod-3"]
    assert sum(a is not b for a, b in zip(first.pods, after.pods, strict=True)) == 1
    assert after.tally == Tally.of(after.pods)


def test_a_pod_gone_and_back_with_the_same_bytes_is_a_change_both_times() -> None:
    fake = FakeKubelet("/nonexistent", large_node(), seed=7)
    fake.shuffle = False
    decoder = Decoder()
    alloc, lst = _answers(fake)
    pods = [p.SerializeToString() for p in api_pb2.ListPodResourcesResponse.FromString(lst).pod_resources]
    first, _ = decoder.decode(alloc, lst)
    without, outcome = decoder.decode(alloc, b"".join(_entry(p) for p in pods[1:]))
    assert outcome is Outcome.CHANGED
    assert len(without.pods) == len(first.pods) - 1
    back, outcome = decoder.decode(alloc, b"".join(_entry(p) for p in reversed(pods)))
    assert outcome is Outcome.CHANGED
    assert back == first == _full(alloc, lst)
