"""Small inventories written as a few names: which GPUs a node has and which pods hold them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from watcher.model.inventory import Inventory
from watcher.model.restore import from_canonical

__all__ = ["GPU", "inventory_of"]

GPU = "nvidia.com/gpu"


def inventory_of(gpus: Sequence[str], pods: Mapping[str, Sequence[str]]) -> Inventory:
    """gpus: allocatable ids; pods: "ns/name" -> the GPU ids its one container ("main") holds."""
    return from_canonical(
        {
            "format": 3,
            "allocatable": {
                "known": True,
                "devices": {GPU: {g: [0] for g in gpus}} if gpus else {},
                "cpu_ids": [0, 1],
                "memory": [],
            },
            "pods": [
                {
                    "namespace": key.split("/")[0],
                    "name": key.split("/")[1],
                    "cpu_ids": [],
                    "memory": [],
                    "containers": [
                        {
                            "name": "main",
                            "devices": {GPU: {g: [0] for g in held}} if held else {},
                            "cpu_ids": [],
                            "memory": [],
                            "dynamic_resources": [],
                        }
                    ],
                }
                for key, held in sorted(pods.items())
            ],
        }
    )
