"""A Pod exactly as upstream's Pods API server sends it, recorded once, so that a fast test can
show our vendored k8s.io.api.core.v1.Pod (watcher/kubeletapi/k8s) decodes the kubelet's bytes.

How it was recorded: kubelet-lite (pkg/kubelet/apis/pods NewPodsServer, v1.37.2) with one
device-plugin serving example.com/gpu (gpu-0, gpu-1); `admit("ml", "trainer-0", {"main":
{"example.com/gpu": 2}, "sidecar": {}}, uid="a-1")`; then ListPods, its one pod's bytes. Go's
generated Marshal is deterministic (map keys sorted), so tests/test_e2e_pod_proto.py records it
again the same way and asserts the same bytes: a change upstream shows there, not as a stale
constant.
"""

from __future__ import annotations

__all__ = ["LITE_POD", "LITE_POD_ADMISSION", "LITE_POD_RESOURCE"]

# namespace, name, uid, container -> resource -> count: what was admitted.
LITE_POD_ADMISSION = ("ml", "trainer-0", "a-1", {"main": {"example.com/gpu": 2}, "sidecar": {}})
LITE_POD_RESOURCE = "example.com/gpu"

LITE_POD = bytes.fromhex(
    "0a1e0a09747261696e65722d3012001a026d6c22002a03612d31320038004200128b01124c0a046d61696e12002a0042"
    "300a160a0f6578616d706c652e636f6d2f67707512030a013212160a0f6578616d706c652e636f6d2f67707512030a01"
    "326a007200800100880100900100a20100121f0a077369646563617212002a0042006a007200800100880100900100a2"
    "01001a00320042004a0052005800600068008201008a01009a0100c201001a1a0a0752756e6e696e671a0022002a0032"
    "004a005a007200880100"
)
