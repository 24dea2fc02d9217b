"""Real changes to a `Model`, one each: any of them must change the inventory's content hash.
Each returns None where it does not apply to the model it is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from testkit.node_model import DevKey, MContainer, MemKey, Model, Numa

__all__ = ["MUTATIONS", "first_container", "with_container"]


def _without_one_device(model: Model) -> Model | None:
    if not model.devices:
        return None
    victim = sorted(model.devices)[0]
    return dataclasses.replace(model, devices={k: v for k, v in model.devices.items() if k != victim})


def _cpu_moved(model: Model) -> Model | None:
    if not model.cpu_ids:
        return None
    cpu = min(model.cpu_ids)
    return dataclasses.replace(model, cpu_ids=(model.cpu_ids - {cpu}) | {max(model.cpu_ids) + 1})


def _device_renumad(model: Model) -> Model | None:
    if not model.devices:
        return None
    key = sorted(model.devices)[0]
    numa = model.devices[key]
    changed = (*numa, 9) if len(numa) < 2 else numa[:1]
    return dataclasses.replace(model, devices={**model.devices, key: changed})


def _memory_grown(model: Model) -> Model | None:
    if not model.memory:
        return None
    key = sorted(model.memory)[0]
    return dataclasses.replace(model, memory={**model.memory, key: model.memory[key] + 1})


def first_container(model: Model) -> tuple[tuple[str, str], str, MContainer] | None:
    for pod_key in sorted(model.pods):
        for name in sorted(model.pods[pod_key].containers):
            return pod_key, name, model.pods[pod_key].containers[name]
    return None


def with_container(model: Model, pod_key: tuple[str, str], name: str, c: MContainer) -> Model:
    p = model.pods[pod_key]
    return dataclasses.replace(
        model,
        pods={**model.pods, pod_key: dataclasses.replace(p, containers={**p.containers, name: c})},
    )


def _container_cpu_changed(model: Model) -> Model | None:
    found = first_container(model)
    if found is None:
        return None
    pod_key, name, c = found
    cpus = c.cpu_ids - {min(c.cpu_ids)} if c.cpu_ids else frozenset({0})
    return with_container(model, pod_key, name, dataclasses.replace(c, cpu_ids=cpus))


def _container_device_dropped_or_added(model: Model) -> Model | None:
    found = first_container(model)
    if found is None:
        return None
    pod_key, name, c = found
    devices: dict[DevKey, Numa] = (
        {k: v for k, v in c.devices.items() if k != min(c.devices)} if c.devices else {("x/y", "new"): ()}
    )
    return with_container(model, pod_key, name, dataclasses.replace(c, devices=devices))


def _share_id_toggled(model: Model) -> Model | None:
    for pod_key in sorted(model.pods):
        for name, c in sorted(model.pods[pod_key].containers.items()):
            for claim_key, devices in sorted(c.claims.items()):
                for dev in sorted(devices, key=repr):
                    other = (*dev[:4], "" if dev[4] is None else None)
                    if other in devices:
                        continue
                    claims = {**c.claims, claim_key: (devices - {dev}) | {other}}
                    return with_container(model, pod_key, name, dataclasses.replace(c, claims=claims))
    return None


def _pod_cpu_changed(model: Model) -> Model | None:
    if not model.pods:
        return None
    key = min(model.pods)
    p = model.pods[key]
    cpus = p.cpu_ids - {min(p.cpu_ids)} if p.cpu_ids else frozenset({63})
    return dataclasses.replace(model, pods={**model.pods, key: dataclasses.replace(p, cpu_ids=cpus)})


def _pod_memory_changed(model: Model) -> Model | None:
    if not model.pods:
        return None
    key = min(model.pods)
    p = model.pods[key]
    memory: dict[MemKey, int] = {k: v + 1 for k, v in p.memory.items()} if p.memory else {("memory", (0,)): 1}
    return dataclasses.replace(model, pods={**model.pods, key: dataclasses.replace(p, memory=memory)})


def _container_memory_changed(model: Model) -> Model | None:
    found = first_container(model)
    if found is None:
        return None
    pod_key, name, c = found
    memory: dict[MemKey, int] = (
        {k: v + 1 for k, v in c.memory.items()} if c.memory else {("hugepages-2Mi", ()): 2}
    )
    return with_container(model, pod_key, name, dataclasses.replace(c, memory=memory))


def _claim_dropped_or_added(model: Model) -> Model | None:
    found = first_container(model)
    if found is None:
        return None
    pod_key, name, c = found
    if c.claims:
        claims = {k: v for k, v in c.claims.items() if k != min(c.claims)}
    else:
        claims = {("default", "new-claim"): frozenset({("drv", "pool", "dev", frozenset(), None)})}
    return with_container(model, pod_key, name, dataclasses.replace(c, claims=claims))


def _pod_dropped(model: Model) -> Model | None:
    if not model.pods:
        return None
    victim = min(model.pods)
    return dataclasses.replace(model, pods={k: v for k, v in model.pods.items() if k != victim})


def _known_toggled(model: Model) -> Model | None:
    if model.devices or model.cpu_ids or model.memory:
        return None  # only an empty allocatable can be toggled to unknown without other changes
    return dataclasses.replace(model, known=not model.known)


MUTATIONS: list[Callable[[Model], Model | None]] = [
    _without_one_device,
    _cpu_moved,
    _device_renumad,
    _memory_grown,
    _container_cpu_changed,
    _container_device_dropped_or_added,
    _share_id_toggled,
    _pod_cpu_changed,
    _pod_memory_changed,
    _container_memory_changed,
    _claim_dropped_or_added,
    _pod_dropped,
    _known_toggled,
]
