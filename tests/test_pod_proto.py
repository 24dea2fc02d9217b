"""Our vendored k8s.io.api.core.v1.Pod reads the bytes upstream's Pods API server sends
(recorded from kubelet-lite: testkit/recorded_pods.py says how)."""

from __future__ import annotations

from testkit.recorded_pods import LITE_POD
from watcher.kubeletapi.k8s import core_v1_pb2


def test_a_pod_from_upstreams_server_decodes_with_every_field_we_read() -> None:
    pod = core_v1_pb2.Pod.FromString(LITE_POD)
    meta = pod.metadata
    assert (meta.namespace, meta.name, meta.uid) == ("ml", "trainer-0", "a-1")
    assert [c.name for c in pod.spec.containers] == ["main", "sidecar"]
    main = pod.spec.containers[0].resources
    assert {k: v.string for k, v in main.limits.items()} == {"example.com/gpu": "2"}
    assert {k: v.string for k, v in main.requests.items()} == {"example.com/gpu": "2"}
    assert pod.status.phase == "Running"
    # Go writes its empty strings and structs too: present but empty, never an error.
    assert meta.HasField("creationTimestamp") and meta.creationTimestamp.seconds == 0
    assert pod.spec.HasField("nodeName") and pod.spec.nodeName == ""
