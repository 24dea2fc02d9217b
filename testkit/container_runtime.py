"""The configuration of a container node's runtime (testkit/container_node.py): containerd 1.6's
config file and the CNI network its pods get, each written into the node's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testkit.node_namespaces import pod_cidr
from testkit.pause_image import PAUSE_IMAGE

__all__ = ["cni_config", "containerd_config"]


def containerd_config(directory: Path) -> str:
    """containerd 1.6's config (version 2) for a node in `directory`."""
    d = str(directory)
    return f"""version = 2
root = "{d}/containerd"
# Inside the node's mount namespace, where /run is DIR/run.
state = "/run/containerd-prw"
# containerd's own oom_score_adj stays as it is: this machine may not lower one.
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
]

[grpc]
  address = "{d}/containerd.sock"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    # Its default is the host's /opt/containerd.
    path = "{d}/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    # Without CAP_SYS_RESOURCE no oom_score_adj may go below this process's: containers keep
    # at least containerd's, whatever the kubelet asks.
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          # The kubelet's cgroupDriver is cgroupfs.
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{d}/cni/net.d"
"""


def cni_config(index: int) -> dict[str, Any]:
    """A bridge with the node's pod range; the bridge is the pods' gateway and masquerades what
    leaves the range (replies from the host come back to the node's address)."""
    return {
        "cniVersion": "1.0.0",
        "name": "prw",
        "plugins": [
            {
                "type": "bridge",
                "bridge": f"prw-br{index}",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr(index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }
