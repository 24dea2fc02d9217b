"""The client configuration the agent connects with, checked before any request: from a kubeconfig
file or the pod's service-account files, every problem one KubernetesError naming the file at fault,
and a bearer token never sent in clear text over the network (on loopback, not without a warning).
`check-config` runs the same checks."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from watcher.config import ConfigError
from watcher.kubeapi.settings import ConnectionSettings

if TYPE_CHECKING:  # imported for real only when the sink is used
    from lightkube.config.kubeconfig import SingleConfig

__all__ = [
    "KubernetesError",
    "client_config",
    "check_client_config",
    "check_transport",
    "clear_text_warning",
]


class KubernetesError(Exception):
    """The Kubernetes API could not be reached or configured; the message says what to do."""


def client_config(settings: ConnectionSettings) -> SingleConfig:
    """The one context the settings name: the kubeconfig's, or in-cluster from the service-account
    files; the files it refers to exist, and its credentials do not travel in clear text."""
    if settings.kubeconfig is not None:
        single = _from_kubeconfig(settings.kubeconfig, settings.context)
        origin = f"kubeconfig {settings.kubeconfig}"
    else:
        single = _in_cluster(settings)
        origin = f"service account {settings.service_account_dir}"
    _check_files(single, origin)
    check_transport(single.cluster.server, _sends_credentials(single), origin)
    return single


def check_client_config(path: str, settings: ConnectionSettings) -> None:
    """`check-config`'s part: the kubeconfig loaded as the sink will load it (in-cluster settings
    are checked for what can be checked outside the pod: the server's scheme)."""
    try:
        if settings.kubeconfig is not None:
            client_config(settings)
        elif settings.server is not None:
            check_transport(settings.server, True, "server")
    except KubernetesError as err:
        key = "kubeconfig" if settings.kubeconfig is not None else "server"
        raise ConfigError(f"{path}.{key}: {err}") from None


def check_transport(server: str, credentials: bool, origin: str) -> None:
    """Refuse a server URL that is not http(s), and a token (or password) sent to plain http://
    anywhere but loopback, where anyone on the network could read it and act as the agent. On
    loopback it goes (a tunnel, `kubectl proxy`), said by `clear_text_warning`."""
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise KubernetesError(f"{origin}: server {server!r} is not an https:// URL")
    if parts.scheme == "http" and credentials and not _is_loopback(parts.hostname):
        raise KubernetesError(
            f"{origin}: refusing to send the bearer token in clear text to {server}: anyone who can "
            "watch that network could read it and act as this agent; use the API server's https:// URL"
        )


def clear_text_warning(settings: ConnectionSettings) -> str | None:
    """What `check_transport` lets through but must not go unsaid: a token (or password) sent to a
    plain http:// server on loopback. No network sees it, but whatever listens on that port does
    (a tunnel, or any program that took the port while the tunnel was down), and can then act as
    the agent. None when nothing is sent in clear text, and for settings that are refused anyway."""
    try:
        if settings.kubeconfig is not None:
            single = _from_kubeconfig(settings.kubeconfig, settings.context)
            server, credentials = single.cluster.server, _sends_credentials(single)
            origin = f"kubeconfig {settings.kubeconfig}"
        elif settings.server is not None:  # in a pod: the service account's token always goes along
            server, credentials, origin = settings.server, True, "server"
        else:
            return None  # in a pod: the API server's own https:// address
    except KubernetesError:
        return None  # refused at start and by check-config, in its own words
    parts = urlsplit(server)
    if parts.scheme != "http" or not credentials or not _is_loopback(parts.hostname or ""):
        return None
    return (
        f"{origin}: the bearer token travels in clear text to {server}: on loopback, but whatever "
        "listens on that port (the tunnel, or any program that took the port while it was down) "
        "can read it and act as this agent; use the API server's https:// URL"
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _from_kubeconfig(path: Path, context: str | None) -> SingleConfig:
    import msgspec
    import yaml  # type: ignore[import-untyped]  # pyyaml, which lightkube brings, ships no types
    from lightkube import ConfigError as LightkubeConfigError
    from lightkube import KubeConfig

    origin = f"kubeconfig {path}"
    try:
        data = yaml.safe_load(path.expanduser().read_text())
    except OSError as err:
        raise KubernetesError(f"cannot read {origin}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise KubernetesError(f"{origin}: not text (UTF-8)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or "unreadable"
        raise KubernetesError(f"{origin}: not YAML{where}: {problem}") from None
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), list):
        raise KubernetesError(f"{origin}: not a kubeconfig (a mapping with clusters, contexts and users)")
    try:
        config = KubeConfig.from_dict(data, fname=path.expanduser())
    except (KeyError, TypeError, AttributeError, ValueError, msgspec.MsgspecError) as err:
        raise KubernetesError(f"{origin}: not a valid kubeconfig: {_said(err)}") from None
    try:
        single = config.get(context_name=context)
    except LightkubeConfigError as err:
        raise KubernetesError(f"{origin}: {err}") from None
    except KeyError as err:  # the context names a cluster or user that is not there
        raise KubernetesError(f"{origin}: its context names {err}, which it does not define") from None
    if single is None:
        raise KubernetesError(f"{origin} has no usable context")
    return single


def _said(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"missing {err}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _in_cluster(settings: ConnectionSettings) -> SingleConfig:
    from lightkube import KubeConfig
    from lightkube.config.models import Cluster, User

    directory = settings.service_account_dir
    token = directory / "token"
    if not token.is_file():
        raise KubernetesError(
            f"no service-account token at {token}: not running in a pod with a token "
            "(apply the kubernetes-reporting overlay), or set kubeconfig"
        )
    server = settings.server or _in_cluster_server()
    namespace = directory / "namespace"
    try:
        name = namespace.read_text().strip() if namespace.is_file() else "default"
    except OSError as err:
        raise KubernetesError(f"cannot read {namespace}: {err.strerror or err}") from None
    config = KubeConfig.from_one(
        cluster=Cluster(server=server, certificate_auth=str(directory / "ca.crt")),
        # token_file: read per request and again on a 401, as the kubelet rotates it.
        user=User(token_file=str(token)),
        namespace=name,
    )
    single = config.get()
    assert single is not None  # from_one always has its one context
    return single


def _in_cluster_server() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubernetesError(
            "KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?): set server or kubeconfig"
        )
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _sends_credentials(single: SingleConfig) -> bool:
    user = single.user
    return user is not None and bool(
        user.token or user.token_file or user.exec or user.auth_provider or (user.username and user.password)
    )


def _check_files(single: SingleConfig, origin: str) -> None:
    """Each file the configuration names exists: the TLS library's own error names none."""
    named: list[tuple[str, Any]] = [("certificate-authority", single.cluster.certificate_auth)]
    if single.user is not None:
        named += [
            ("client-certificate", single.user.client_cert),
            ("client-key", single.user.client_key),
            ("tokenFile", single.user.token_file),
        ]
    for key, value in named:
        if value:
            file = Path(single.abs_file(value))
            if not file.is_file():
                raise KubernetesError(f"{origin}: {key} {file}: no such file")
