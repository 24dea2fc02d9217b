"""Our copies of upstream's wire contracts stay faithful: every message and field we vendor of
k8s.io/api core/v1 (and of apimachinery's meta/v1 and resource) and of the kubelet's Pods API has
upstream's name, number, label and type, read from the upstream files of the versions peers/go.mod
pins (in Go's module cache, which `make e2e` fills when it builds the peers). And the recorded Pod
(testkit/recorded_pods.py) is still what upstream's server sends."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from grpc import aio

from testkit.kubelet_lite import KubeletLite
from testkit.peers import peer
from testkit.proto_text import Field, messages
from testkit.protowire import every
from testkit.recorded_pods import LITE_POD, LITE_POD_ADMISSION, LITE_POD_RESOURCE
from testkit.tools import ON_CI
from watcher.kubeletapi.k8s import core_v1_pb2, meta_v1_pb2, resource_pb2
from watcher.kubeletapi.v1alpha1 import pods_pb2

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
_NAMES = {
    getattr(FieldDescriptor, name): name.removeprefix("TYPE_").lower()
    for name in dir(FieldDescriptor)
    if name.startswith("TYPE_")
}
_LABELS = {
    descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL: "optional",
    descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED: "repeated",
    descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED: "required",
}


def _type(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        entry = field.message_type
        if entry.GetOptions().map_entry:
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            return f"map<{_type(key)},{_type(value)}>"
        return str(entry.full_name)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return str(field.enum_type.full_name)
    return _NAMES[field.type]


def _ours(file: FileDescriptor) -> dict[str, dict[str, Field]]:
    """Our messages as written in our .proto: the labels from the file's own descriptor."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    proto3 = proto.syntax == "proto3"
    out: dict[str, dict[str, Field]] = {}
    for message in proto.message_type:
        described = file.message_types_by_name[message.name]
        fields: dict[str, Field] = {}
        for f in message.field:
            kind = _type(described.fields_by_name[f.name])
            if kind.startswith("map<"):
                label = "repeated"  # what the text's map<> is, on the wire
            elif proto3 and f.label == f.LABEL_OPTIONAL and not f.proto3_optional:
                label = ""  # a proto3 singular field is written without a label
            else:
                label = _LABELS[f.label]
            fields[f.name] = (f.number, label, kind)
        out[f"{proto.package}.{message.name}"] = fields
    return out


def _pinned(module: str) -> str:
    """The version of `module` peers/go.mod builds with (its replace line, else its require)."""
    text = (ROOT / "peers" / "go.mod").read_text()
    replaced = re.search(rf"^\s*{re.escape(module)}\s*=>\s*\S+\s+(v\S+)", text, re.M)
    required = re.search(rf"^\s*{re.escape(module)}\s+(v\S+)", text, re.M)
    found = replaced or required
    assert found, f"peers/go.mod does not name {module}"
    return found.group(1)


@pytest.fixture(scope="module")
def modcache() -> Path:
    peer("kubelet-lite")  # skips (or fails under CI) where the peers were not built
    go = shutil.which("go")
    if go is None:
        message = "go is not installed: the upstream .proto files are in its module cache"
        if ON_CI:
            pytest.fail(message)
        pytest.skip(message)
    out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=30)
    return Path(out.stdout.strip())


def _upstream(modcache: Path, module: str, path: str, package: str) -> dict[str, dict[str, Field]]:
    file = modcache / f"{module}@{_pinned(module)}" / path
    assert file.is_file(), f"{file} is missing: `make peers` downloads {module}"
    return messages(file.read_text(), package)


@pytest.mark.parametrize(
    ("ours", "module", "path", "whole"),
    [
        (core_v1_pb2.DESCRIPTOR, "k8s.io/api", "core/v1/generated.proto", False),
        (meta_v1_pb2.DESCRIPTOR, "k8s.io/apimachinery", "pkg/apis/meta/v1/generated.proto", False),
        (resource_pb2.DESCRIPTOR, "k8s.io/apimachinery", "pkg/api/resource/generated.proto", False),
        (pods_pb2.DESCRIPTOR, "k8s.io/kubelet", "pkg/apis/pods/v1alpha1/api.proto", True),
    ],
    ids=["core-v1", "meta-v1", "resource", "pods-api"],
)
def test_every_vendored_field_is_upstreams(
    modcache: Path, ours: FileDescriptor, module: str, path: str, whole: bool
) -> None:
    upstream = _upstream(modcache, module, path, ours.package)
    mine = _ours(ours)
    assert mine, "nothing vendored"
    for message, fields in mine.items():
        assert message in upstream, f"{message} is not upstream's"
        for name, shape in fields.items():
            assert name in upstream[message], f"{message}.{name} is not upstream's"
            assert shape == upstream[message][name], (
                f"{message}.{name}: ours {shape}, upstream's {upstream[message][name]}"
            )
    if whole:  # the Pods API is copied whole, not a subset
        assert mine == upstream


async def test_the_recorded_pod_is_still_what_upstreams_server_sends(kubelet_lite: KubeletLite) -> None:
    namespace, name, uid, containers = LITE_POD_ADMISSION
    await kubelet_lite.add_plugin(LITE_POD_RESOURCE, {"gpu-0": [0], "gpu-1": [1]})
    await kubelet_lite.admit(namespace, name, containers, uid=uid)
    async with aio.insecure_channel(f"unix:{kubelet_lite.pods_api_socket}") as channel:
        answer = await channel.unary_unary("/v1alpha1.Pods/ListPods")(b"", timeout=5)
    assert every(bytes(answer), 1) == [LITE_POD]
