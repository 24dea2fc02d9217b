"""The kubelet's Pods API reaches the agent in every shipped deployment.

Each render (`helm template` with every documented values set; the kustomize base and each overlay, by
`build()` and by the real kustomize) is read the way the agent would meet it: the container's
`--config` file is found through its mount and volume in that render's ConfigMap, parsed into the
agent's settings, and the directory of each socket those settings dial must be mounted into the
container at exactly that path, as a hostPath DIRECTORY (the kubelet replaces its sockets; a file
mount would pin a dead one). Without the Pods API's mount the agent stays `absent` for it on every
node: no DRA health, no owner or uid in events.
"""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from testkit.helm_chart import VALUES_SETS, pod, render
from testkit.manifests import BASE, OVERLAYS, build, kustomize, load_yaml_docs
from watcher.settings import Settings, pods_api_socket
from watcher.settings_file import parse_settings

KUSTOMIZATIONS = {"base": BASE, **OVERLAYS}
HOST_DEFAULT = "/var/lib/kubelet/pods-api"  # the kubelet's root dir's pods-api, the chart's default value


@pytest.fixture(autouse=True)
def _downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the DaemonSet sets from the downward API, which the shipped config reads."""
    monkeypatch.setenv("POD_IP", "10.244.3.17")
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")


def _config_text(objs: list[dict[str, Any]], spec: dict[str, Any]) -> str:
    """The config file the container's `--config` names, as that render's ConfigMap holds it."""
    (container,) = spec["containers"]
    path = PurePosixPath(container["args"][container["args"].index("--config") + 1])
    (mount,) = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == path.parent]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    name = volume["configMap"]["name"]
    (config_map,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    text: str = config_map["data"][path.name]
    return text


def _settings(objs: list[dict[str, Any]], spec: dict[str, Any]) -> Settings:
    return parse_settings(tomllib.loads(_config_text(objs, spec)))


def _mounted_directory(spec: dict[str, Any], directory: PurePosixPath) -> tuple[dict[str, Any], ...]:
    """The container's mount at exactly `directory` (not an ancestor: that would hand the agent the
    kubelet's whole root), and its volume."""
    (container,) = spec["containers"]
    paths = [m["mountPath"] for m in container["volumeMounts"]]
    mounts = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == directory]
    assert len(mounts) == 1, f"{directory} is not mounted: {paths}"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mounts[0]["name"]]
    return mounts[0], volume


def _check_pods_api(objs: list[dict[str, Any]], host_path: str = HOST_DEFAULT) -> None:
    spec = pod(objs)
    settings = _settings(objs, spec)
    assert settings.pods.api is True
    socket = pods_api_socket(settings)
    assert socket.name == "pods-api.sock"
    mount, volume = _mounted_directory(spec, PurePosixPath(socket.parent))
    assert mount.get("subPath") is None
    # Read-only: connecting to the socket is checked against the socket's own mode, not the mount.
    assert mount.get("readOnly") is True
    # OrCreate: a kubelet without the Pods API has no such directory, and the pod must start there.
    assert volume["hostPath"] == {"path": host_path, "type": "DirectoryOrCreate"}
    # The pod-resources socket the same way, beside it: every socket the agent dials is reachable.
    mount, volume = _mounted_directory(spec, PurePosixPath(settings.kubelet.socket.parent))
    assert volume["hostPath"]["type"] == "Directory"


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_each_helm_values_set_mounts_the_pods_api_where_its_config_points(name: str, tmp_path: Path) -> None:
    values = VALUES_SETS[name]
    _check_pods_api(render(values, tmp_path), values.get("hostPaths", {}).get("podsApi", HOST_DEFAULT))


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_each_kustomization_mounts_the_pods_api_where_its_config_points(name: str) -> None:
    _check_pods_api(build(KUSTOMIZATIONS[name]))
    _check_pods_api(load_yaml_docs(kustomize(KUSTOMIZATIONS[name])))


def test_the_chart_moves_only_the_host_side_of_the_pods_api(tmp_path: Path) -> None:
    """Another kubelet root (k0s) changes the hostPath; the container path, and so the config, stay."""
    objs = render({"hostPaths": {"podsApi": "/var/lib/k0s/kubelet/pods-api"}}, tmp_path)
    _check_pods_api(objs, "/var/lib/k0s/kubelet/pods-api")


def test_the_check_refuses_a_render_without_the_mount(tmp_path: Path) -> None:
    """The check itself: the same render with the Pods API's mount taken out fails it."""
    objs = build(BASE)
    (container,) = pod(objs)["containers"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "pods-api"]
    with pytest.raises(AssertionError, match="pods-api is not mounted"):
        _check_pods_api(objs)
