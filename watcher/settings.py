"""The agent's settings: frozen dataclasses with their defaults and doc strings in one place.

`watcher.settings_file` reads them from TOML and checks what spans keys; every bad input becomes
one `ConfigError` line naming the key path, the kind of value given (never the value) and what is
allowed (see `watcher.config`); each sink's table is read by its sink type (see
`watcher.sinks.registry`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from watcher.config import ConfigError, field_meta
from watcher.kubeapi.settings import KubernetesApiSettings
from watcher.kubelet.client import DEFAULT_MAX_RECEIVE_BYTES, DEFAULT_SOCKET, DEFAULT_TIMEOUT
from watcher.model.rejections import THRESHOLD_DOC, WINDOW_DOC
from watcher.secrets import Secret
from watcher.sinks.base import BaseSinkSettings
from watcher.sinks.stdout import StdoutSinkSettings
from watcher.sources.expected_settings import ExpectedSettings
from watcher.sources.pods_api.watch import DEFAULT_RESYNC_INTERVAL, DEFAULT_SNAPSHOT_TIMEOUT
from watcher.sources.taint_rule_settings import DeviceTaintRulesSettings

__all__ = [
    "KubeletSettings",
    "WatchSettings",
    "PodsSettings",
    "DEFAULT_POD_LABELS",
    "LogSettings",
    "HttpSettings",
    "Settings",
    "default_node_name",
    "pods_api_socket",
]


@dataclass(frozen=True)
class KubeletSettings:
    socket: Path = field(
        default=Path(DEFAULT_SOCKET),
        metadata=field_meta(
            "The kubelet's pod-resources socket. Its DIRECTORY is watched and must be mounted."
        ),
    )
    root_dir: Path = field(
        default=Path("/var/lib/kubelet"),
        metadata=field_meta(
            "The kubelet's root dir: device-plugins/ and the CPU/memory/DRA manager state files."
        ),
    )
    timeout: float = field(
        default=DEFAULT_TIMEOUT, metadata=field_meta("Deadline of each call, seconds.", min=0.001, max=600)
    )
    max_receive_bytes: int = field(
        default=DEFAULT_MAX_RECEIVE_BYTES,
        metadata=field_meta(
            "Largest response accepted, bytes; it bounds the agent's memory too (about 16x).", min=1024
        ),
    )
    unreachable_grace: float = field(
        default=30.0,
        metadata=field_meta(
            "Seconds of failed queries before `kubelet.unreachable` is reported.", min=0, max=86400
        ),
    )
    warmup_grace: float = field(
        default=60.0,
        metadata=field_meta(
            "Seconds to wait, after a kubelet or device plugin restart, for the plugins to register "
            "again and List to fill in before what is still missing is reported.",
            min=0,
            max=3600,
        ),
    )


# Label keys events carry by default: the recommended app labels, and two that teams commonly set.
DEFAULT_POD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app",
    "team",
)


@dataclass(frozen=True)
class PodsSettings:
    api: bool = field(
        default=True,
        metadata=field_meta(
            "Watch the kubelet's Pods API when its socket is there (Kubernetes 1.37, gate PodsAPI): "
            "pod changes are seen at once, re-read with pod-resources Get, and events name the pod's "
            "uid, owner and labels; DRA device health comes from the Pod status. Without the socket "
            "the agent works from pod-resources alone, as on older kubelets."
        ),
    )
    api_socket: Path | None = field(
        default=None,
        metadata=field_meta(
            "The Pods API's socket; default `pods-api/pods-api.sock` under `kubelet.root_dir`. Its "
            "directory is watched and must be mounted."
        ),
    )
    labels: tuple[str, ...] = field(
        default=DEFAULT_POD_LABELS,
        metadata=field_meta(
            "Pod label keys events carry (values cut to 63 characters, control characters removed); "
            "[] for none."
        ),
    )
    resync_interval: float = field(
        default=DEFAULT_RESYNC_INTERVAL,
        metadata=field_meta(
            "While the watch is live, one ListPods this often (+-10%), compared with what the stream "
            "said: a stream that stopped delivering has what it missed reported, one warning logged, "
            "and is reconnected. Seconds; 0: never.",
            min=0,
        ),
    )
    snapshot_timeout: float = field(
        default=DEFAULT_SNAPSHOT_TIMEOUT,
        metadata=field_meta(
            "Seconds a watch's snapshot may take, from the connect to INITIAL_SYNC_COMPLETE (10,000 "
            "pods take about one); then, as past 25,000 pods or 512 MiB, the watch is `capped`.",
            min=1,
        ),
    )
    health_unknown_grace: float = field(
        default=120.0,
        metadata=field_meta(
            "Seconds a DRA device's health may stay Unknown (its driver stopped reporting) before "
            "one `device.health_unknown` warning; never a page.",
            min=0,
            max=86400,
        ),
    )
    status_gather: float = field(
        default=0.1,
        metadata=field_meta(
            "Seconds without another pod-status change before the agent looks (at most five "
            "times this after the first): a DRA driver's verdict reaches many pods' statuses one "
            "after another, and one look at the burst makes a driver crash one `device.incident`. "
            "Each DRA health event waits this long; 0 looks at once.",
            min=0,
            max=5,
        ),
    )
    unheld_grace: float = field(
        default=900.0,
        metadata=field_meta(
            "Seconds an open DRA device story (`device.unhealthy`, `device.health_unknown`) waits for "
            "a new holder once no pod holds the device: a new holder's Healthy resolves it; after "
            "this, one `device.health_unobserved` closes it unconfirmed (no heal), so a later "
            "failure pages again.",
            min=0,
            max=86400,
        ),
    )
    rejections_threshold: int = field(default=3, metadata=field_meta(THRESHOLD_DOC, min=0, max=100000))
    rejections_window: float = field(default=300.0, metadata=field_meta(WINDOW_DOC, min=1, max=86400))


@dataclass(frozen=True)
class ResourceSlicesSettings:
    enabled: bool = field(
        default=True,
        metadata=field_meta(
            "Read the node's ResourceSlices where the agent talks to the API server ([kubernetes] api: "
            "with a `kubernetes` sink, or `on`; needs `list` on resource.k8s.io resourceslices) and "
            "count a device's NoSchedule/NoExecute taint as Unhealthy, one story with the Pod status's."
        ),
    )
    interval: float = field(
        default=30.0,
        metadata=field_meta("Seconds between two lists of the node's ResourceSlices.", min=1, max=3600),
    )


@dataclass(frozen=True)
class WatchSettings:
    interval: float = field(
        default=30.0, metadata=field_meta("Periodic re-query, seconds: the safety net.", min=0.05, max=86400)
    )
    jitter: float = field(
        default=0.1,
        metadata=field_meta(
            "Fraction of `interval` by which each period varies, so nodes spread out.", min=0, max=1
        ),
    )
    debounce: float = field(
        default=0.02,
        metadata=field_meta("Seconds to gather more triggers into one re-query.", min=0, max=5),
    )
    max_rpc_rate: float = field(
        default=5.0,
        metadata=field_meta(
            "Most RPCs per second we send; the kubelet allows 100/s for ALL clients.", min=0.1, max=50
        ),
    )
    state_file_triggers: bool = field(
        default=True,
        metadata=field_meta(
            "Re-query when the kubelet's checkpoint, CPU/memory/DRA state or plugin sockets change."
        ),
    )
    force_polling: bool = field(
        default=False, metadata=field_meta("Poll directories instead of using inotify.")
    )
    poll_interval: float = field(
        default=0.1,
        metadata=field_meta("Polling period when inotify is unavailable, seconds.", min=0.01, max=60),
    )
    step: float = field(
        default=0.1,
        metadata=field_meta(
            "Seconds the one directory watch waits between looks at what inotify queued, while "
            "the Pods API stream is live and the kubelet answers (its end tells of a restart at once). "
            "A rewritten state file reaches the agent one to two steps after it changes; each look "
            "costs CPU whatever it finds, so a shorter step is a quicker change at more idle CPU.",
            min=0.005,
            max=5,
        ),
    )
    hurry_step: float = field(
        default=0.01,
        metadata=field_meta(
            "The same, while a restart is awaited or nothing else would tell of one (no Pods API): "
            "a new socket is seen one to two steps after it appears.",
            min=0.005,
            max=5,
        ),
    )
    snapshot_interval: float = field(
        default=0.0,
        metadata=field_meta(
            "Emit an inventory.snapshot event this often so push consumers can reconcile; 0: never.",
            min=0,
            max=7 * 86400,
        ),
    )
    incident_threshold: int = field(
        default=8,
        metadata=field_meta(
            "This many devices of one resource leaving allocatable in one re-query are one "
            "device.incident for paging sinks instead of a page each; 0: never.",
            min=0,
            max=100000,
        ),
    )
    flap_limit: int = field(
        default=4,
        metadata=field_meta(
            "A device with more health changes than this within flap_window is flapping: "
            "notification sinks get one device.flapping instead of each change; 0: never.",
            min=0,
            max=1000,
        ),
    )
    flap_window: float = field(
        default=600.0, metadata=field_meta("The window flap_limit counts in, seconds.", min=1, max=86400)
    )
    flap_quiet: float = field(
        default=300.0,
        metadata=field_meta(
            "A flapping device stable this long gets device.flap_ended, seconds.", min=1, max=86400
        ),
    )
    reset_hold_down: float = field(
        default=600.0,
        metadata=field_meta(
            "A failed device back right after its device plugin or DRA driver registered again is "
            "device.reset, not a heal: its page stays open until it has stayed up this long, "
            "seconds; then the heal follows. 0: such a device heals at once, as any other.",
            min=0,
            max=86400,
        ),
    )


@dataclass(frozen=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata=field_meta("Log level.")
    )
    format: Literal["auto", "json", "console"] = field(
        default="auto", metadata=field_meta("auto: console on a TTY, JSON otherwise.")
    )


@dataclass(frozen=True)
class HttpSettings:
    enabled: bool = field(
        default=True, metadata=field_meta("Serve /metrics, /healthz, /readyz (and /inventory if enabled).")
    )
    listen: str = field(
        default="127.0.0.1:9108",
        metadata=field_meta(
            "HOST:PORT to listen on; loopback by default. ${NAME} is replaced by that environment "
            "variable (an address with ':' gets its [brackets]), e.g. ${POD_IP}:9108; port 0: any free port."
        ),
    )
    ready_stale_after: float = field(
        default=120.0,
        metadata=field_meta(
            "/readyz fails when the last successful re-query is older than this, seconds.", min=1
        ),
    )
    inventory: bool = field(
        default=False,
        metadata=field_meta(
            "Serve /inventory (every pod's devices): needs inventory_token(_file) or tls_client_ca_file."
        ),
    )
    inventory_token: Secret | None = field(
        default=None,
        metadata=field_meta(
            "Bearer token /inventory requires (Authorization: Bearer ...); the file is re-read when it "
            "changes.",
            secret=True,
        ),
    )
    tls_cert_file: Path | None = field(
        default=None,
        metadata=field_meta("Server certificate (PEM): with tls_key_file, the server speaks HTTPS only."),
    )
    tls_key_file: Path | None = field(
        default=None, metadata=field_meta("The server certificate's private key (PEM).", private=True)
    )
    tls_client_ca_file: Path | None = field(
        default=None,
        metadata=field_meta(
            "CA (PEM) client certificates must chain to; a verified client certificate admits to /inventory."
        ),
    )
    header_timeout: float = field(
        default=10.0,
        metadata=field_meta(
            "A connection whose request headers (TLS handshake included) are not complete this long "
            "after it opened, or after their first byte, is closed, seconds.",
            min=0.1,
            max=300,
        ),
    )
    idle_timeout: float = field(
        default=60.0,
        metadata=field_meta(
            "A kept-alive connection with no new request this long after its last answer is closed, seconds.",
            min=0.1,
            max=3600,
        ),
    )
    request_timeout: float = field(
        default=60.0,
        metadata=field_meta(
            "A request not answered to its last byte this long after its headers (a client that reads "
            "slowly) is cut off, seconds.",
            min=0.1,
            max=3600,
        ),
    )
    max_connections: int = field(
        default=100,
        metadata=field_meta(
            "Most HTTP connections open at once; the next one closes the connection that has waited "
            "longest without a request in flight. Each costs a file descriptor.",
            min=2,
            max=10000,
        ),
    )
    max_device_series: int = field(
        default=1024,
        metadata=field_meta(
            "Most device_healthy series /metrics exports (failed devices first); beyond it devices are "
            "left out, counted in device_series_omitted and logged. 0: no device_healthy at all. "
            "Also the most (resource, NUMA node) pairs of the per-NUMA resource_* and memory_* series "
            "(the rest counted in numa_series_omitted).",
            min=0,
            max=100000,
        ),
    )


def pods_api_socket(settings: Settings) -> Path:
    """Where the kubelet serves its Pods API: `[pods] api_socket`, else under its root dir."""
    configured = settings.pods.api_socket
    return configured if configured is not None else settings.kubelet.root_dir / "pods-api" / "pods-api.sock"


def default_node_name() -> str:
    """The node this runs on: $NODE_NAME, else the hostname; ConfigError if that is no UTF-8 text,
    as no event naming it could ever be stored (Python keeps the bad bytes as lone surrogates)."""
    node = os.environ.get("NODE_NAME") or socket.gethostname()
    try:
        node.encode()
    except UnicodeEncodeError:
        source = "$NODE_NAME" if os.environ.get("NODE_NAME") else "the hostname"
        raise ConfigError(f"node: {source} is not valid UTF-8; set node in the config file") from None
    return node


def _default_sinks() -> tuple[BaseSinkSettings, ...]:
    return (StdoutSinkSettings(name="stdout"),)


@dataclass(frozen=True)
class Settings:
    node: str = field(
        default_factory=default_node_name,
        metadata=field_meta("Node name; default $NODE_NAME, else hostname."),
    )
    state_dir: Path = field(
        default=Path("/var/lib/pod-resources-watcher"),
        metadata=field_meta("Where the state (and the outbox) live; hostPath in a DaemonSet."),
    )
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    pods: PodsSettings = field(default_factory=PodsSettings)
    resource_slices: ResourceSlicesSettings = field(default_factory=ResourceSlicesSettings)
    device_taint_rules: DeviceTaintRulesSettings = field(default_factory=DeviceTaintRulesSettings)
    expected: ExpectedSettings = field(default_factory=ExpectedSettings)
    kubernetes: KubernetesApiSettings = field(default_factory=KubernetesApiSettings)
    log: LogSettings = field(default_factory=LogSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    sinks: tuple[BaseSinkSettings, ...] = field(
        default_factory=_default_sinks,
        metadata=field_meta(
            "Where events go: a table per sink, [sinks.NAME], named by you; its `type` says which kind. "
            "Without any [sinks.*] table, events go to stdout as JSON lines."
        ),
    )
