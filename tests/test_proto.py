"""The committed generated code matches proto/, and proto/ matches the kubelet's wire contract."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from watcher.kubeletapi.v1 import api_pb2

ROOT = Path(__file__).resolve().parent.parent


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    gen = _generator()
    stale = [
        gen.relative(path)
        for path in gen.generate(tmp_path)
        if path.read_bytes() != (gen.OUTPUT_DIR / gen.relative(path)).read_bytes()
    ]
    assert not stale, f"run `make proto`: committed output differs for {stale}"


REP, ONE = True, False  # repeated or singular
T = FieldDescriptor
# (message, field) -> (number, type, repeated): the reference's wire contract.
CONTRACT = {
    ("AllocatableResourcesResponse", "devices"): (1, T.TYPE_MESSAGE, REP),
    ("AllocatableResourcesResponse", "cpu_ids"): (2, T.TYPE_INT64, REP),
    ("AllocatableResourcesResponse", "memory"): (3, T.TYPE_MESSAGE, REP),
    ("ListPodResourcesResponse", "pod_resources"): (1, T.TYPE_MESSAGE, REP),
    ("PodResources", "name"): (1, T.TYPE_STRING, ONE),
    ("PodResources", "namespace"): (2, T.TYPE_STRING, ONE),
    ("PodResources", "containers"): (3, T.TYPE_MESSAGE, REP),
    ("PodResources", "cpu_ids"): (4, T.TYPE_INT64, REP),
    ("PodResources", "memory"): (5, T.TYPE_MESSAGE, REP),
    ("ContainerResources", "name"): (1, T.TYPE_STRING, ONE),
    ("ContainerResources", "devices"): (2, T.TYPE_MESSAGE, REP),
    ("ContainerResources", "cpu_ids"): (3, T.TYPE_INT64, REP),
    ("ContainerResources", "memory"): (4, T.TYPE_MESSAGE, REP),
    ("ContainerResources", "dynamic_resources"): (5, T.TYPE_MESSAGE, REP),
    ("ContainerDevices", "resource_name"): (1, T.TYPE_STRING, ONE),
    ("ContainerDevices", "device_ids"): (2, T.TYPE_STRING, REP),
    ("ContainerDevices", "topology"): (3, T.TYPE_MESSAGE, ONE),
    ("ContainerMemory", "memory_type"): (1, T.TYPE_STRING, ONE),
    ("ContainerMemory", "size"): (2, T.TYPE_UINT64, ONE),
    ("ContainerMemory", "topology"): (3, T.TYPE_MESSAGE, ONE),
    ("TopologyInfo", "nodes"): (1, T.TYPE_MESSAGE, REP),
    ("NUMANode", "ID"): (1, T.TYPE_INT64, ONE),
    ("DynamicResource", "claim_name"): (2, T.TYPE_STRING, ONE),
    ("DynamicResource", "claim_namespace"): (3, T.TYPE_STRING, ONE),
    ("DynamicResource", "claim_resources"): (4, T.TYPE_MESSAGE, REP),
    ("ClaimResource", "cdi_devices"): (1, T.TYPE_MESSAGE, REP),
    ("ClaimResource", "driver_name"): (2, T.TYPE_STRING, ONE),
    ("ClaimResource", "pool_name"): (3, T.TYPE_STRING, ONE),
    ("ClaimResource", "device_name"): (4, T.TYPE_STRING, ONE),
    ("ClaimResource", "share_id"): (5, T.TYPE_STRING, ONE),
    ("CDIDevice", "name"): (1, T.TYPE_STRING, ONE),
    ("GetPodResourcesRequest", "pod_name"): (1, T.TYPE_STRING, ONE),
    ("GetPodResourcesRequest", "pod_namespace"): (2, T.TYPE_STRING, ONE),
    ("GetPodResourcesResponse", "pod_resources"): (1, T.TYPE_MESSAGE, ONE),
}


def test_messages_match_the_wire_contract() -> None:
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1"
    seen = set()
    for name, message in file.message_types_by_name.items():
        for field in message.fields:
            key = (name, field.name)
            seen.add(key)
            assert key in CONTRACT, f"{name}.{field.name} is not in the kubelet's API"
            number, type_, label = CONTRACT[key]
            assert (field.number, field.type, field.is_repeated) == (number, type_, label), key
    assert seen == set(CONTRACT)
    assert set(file.message_types_by_name) >= {"AllocatableResourcesRequest", "ListPodResourcesRequest"}


def test_dynamic_resource_field_1_is_reserved_and_share_id_is_optional() -> None:
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    dynamic = next(m for m in proto.message_type if m.name == "DynamicResource")
    assert [(r.start, r.end) for r in dynamic.reserved_range] == [(1, 2)]
    share = api_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"]
    assert share.has_presence  # proto3 `optional`: unset and "" differ
    assert not api_pb2.ClaimResource().HasField("share_id")


def test_service_methods() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


# view -> the message it reads. A view that missed a field would make changes to it invisible.
VIEWS = {
    "AllocatableView": "AllocatableResourcesResponse",
    "ListView": "ListPodResourcesResponse",
    "ListChunks": "ListPodResourcesResponse",
    "PodView": "PodResources",
    "ContainerView": "ContainerResources",
}


@pytest.mark.parametrize("view_name", sorted(VIEWS))
def test_each_view_reads_every_field_of_its_message_with_the_same_wire_shape(view_name: str) -> None:
    from watcher.kubeletapi.v1 import views_pb2

    view = views_pb2.DESCRIPTOR.message_types_by_name[view_name]
    real = api_pb2.DESCRIPTOR.message_types_by_name[VIEWS[view_name]]
    assert {f.name for f in view.fields} == {f.name for f in real.fields}
    for f in real.fields:
        v = view.fields_by_name[f.name]
        assert v.number == f.number, f.name
        assert v.is_repeated == f.is_repeated, f.name
        if f.type == T.TYPE_MESSAGE:
            # A message read as bytes keeps its encoding; or as another view of it.
            assert v.type == T.TYPE_BYTES or VIEWS.get(v.message_type.name) == f.message_type.name, f.name
        else:
            assert v.type == f.type, f.name


def test_the_lenient_messages_are_the_api_with_every_string_as_bytes() -> None:
    """Same messages, numbers, repetition and nesting; only string becomes bytes (one wire format),
    so a repaired answer re-parses as the API message it came from."""
    from watcher.kubeletapi.v1 import lenient_pb2

    checked = 0
    for name, lenient in lenient_pb2.DESCRIPTOR.message_types_by_name.items():
        api = api_pb2.DESCRIPTOR.message_types_by_name[name]
        assert set(lenient.fields_by_number) == set(api.fields_by_number), name
        for number, field in api.fields_by_number.items():
            mine = lenient.fields_by_number[number]
            want = FieldDescriptor.TYPE_BYTES if field.type == FieldDescriptor.TYPE_STRING else field.type
            assert (mine.name, mine.type, mine.is_repeated) == (field.name, want, field.is_repeated), name
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                assert mine.message_type.name == field.message_type.name
            checked += 1
    assert {"ListPodResourcesResponse", "AllocatableResourcesResponse"} <= set(
        lenient_pb2.DESCRIPTOR.message_types_by_name
    )
    assert checked >= 25


# The Pods API (k8s.io/kubelet pkg/apis/pods/v1alpha1 api.proto): (message, field) -> wire shape.
PODS_CONTRACT = {
    ("WatchPodsEvent", "type"): (1, T.TYPE_ENUM, ONE),
    ("WatchPodsEvent", "pod"): (2, T.TYPE_BYTES, ONE),
    ("ListPodsResponse", "pods"): (1, T.TYPE_BYTES, REP),
    ("GetPodResponse", "pod"): (1, T.TYPE_BYTES, ONE),
    ("GetPodRequest", "podUID"): (1, T.TYPE_STRING, ONE),
}


def test_the_pods_api_matches_its_wire_contract() -> None:
    from watcher.kubeletapi.v1alpha1 import pods_pb2

    file = pods_pb2.DESCRIPTOR
    assert file.package == "v1alpha1"
    found = {
        (name, f.name): (f.number, f.type, f.is_repeated)
        for name, message in file.message_types_by_name.items()
        for f in message.fields
    }
    assert found == PODS_CONTRACT
    assert set(file.message_types_by_name) == {name for name, _ in PODS_CONTRACT} | {
        "WatchPodsRequest",
        "ListPodsRequest",
    }
    kinds = {v.name: v.number for v in file.enum_types_by_name["EventType"].values}
    assert kinds == {"UNSPECIFIED": 0, "ADDED": 1, "MODIFIED": 2, "DELETED": 3, "INITIAL_SYNC_COMPLETE": 4}
    service = file.services_by_name["Pods"]
    assert service.full_name == "v1alpha1.Pods"
    methods = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert methods == {
        "WatchPods": ("WatchPodsRequest", "WatchPodsEvent", True),
        "ListPods": ("ListPodsRequest", "ListPodsResponse", False),
        "GetPod": ("GetPodRequest", "GetPodResponse", False),
    }


def test_the_vendored_kubernetes_messages_keep_upstreams_packages() -> None:
    from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2, resource_pb2

    assert core_v1_pb2.Pod.DESCRIPTOR.full_name == "k8s.io.api.core.v1.Pod"
    assert meta_v1_pb2.ObjectMeta.DESCRIPTOR.full_name == "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    assert resource_pb2.Quantity.DESCRIPTOR.full_name == "k8s.io.apimachinery.pkg.api.resource.Quantity"
    # proto2 as upstream: presence on every singular field.
    assert core_v1_pb2.PodStatus.DESCRIPTOR.fields_by_name["phase"].has_presence
    assert core_v1_pb2.ResourceHealth.DESCRIPTOR.fields_by_name["message"].number == 6
