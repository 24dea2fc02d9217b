"""Who may call the fake API server: its users, each with bearer tokens that rotate as projected
service account tokens do, and the built-in admin (in system:masters)."""

from __future__ import annotations

import copy
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from watcher.sim.apiserver.errors import ApiError
from watcher.sim.apiserver.values import Json

__all__ = ["ADMIN", "PUBLIC_PATHS", "Users", "pod_bound_user"]

ADMIN = "admin"
# Served without a token, as to system:public-info-viewer.
PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")


class Users:
    """Users by handle, and their tokens: token -> (handle, monotonic time it stops working or None)."""

    def __init__(self, users: Mapping[str, Mapping[str, Any]]) -> None:
        self.info: dict[str, Json] = {ADMIN: {"username": "kubernetes-admin", "groups": ["system:masters"]}}
        self._tokens: dict[str, tuple[str, float | None]] = {}
        self._token_files: dict[str, list[Path]] = {}
        for handle, info in users.items():
            self.add(handle, info)
        self.info[ADMIN]["groups"] = ["system:masters", "system:authenticated"]
        self.info[ADMIN].setdefault("extra", {})
        self._tokens[secrets.token_urlsafe(32)] = (ADMIN, None)

    def add(self, handle: str, info: Mapping[str, Any]) -> None:
        """A user and a token of it (a second add of the same handle is refused)."""
        if handle in self.info:
            raise ValueError(f"user {handle!r} exists")
        self.info[handle] = _user_info(info)
        self._tokens[secrets.token_urlsafe(32)] = (handle, None)

    def token(self, user: str) -> str:
        """A token of `user` that works now (the newest)."""
        now = time.monotonic()
        valid = [t for t, (h, until) in self._tokens.items() if h == user and (until is None or until > now)]
        if not valid:
            raise KeyError(f"no valid token for user {user!r}")
        return valid[-1]

    def rotate_token(self, user: str, *, grace: float = 0.0) -> str:
        """A new token for `user`; the old ones stop working after `grace` seconds, as a projected
        service account token is replaced. A token file written for the user gets the new one."""
        if user not in self.info:
            raise KeyError(user)
        until = time.monotonic() + grace
        for t, (h, old_until) in list(self._tokens.items()):
            if h == user:
                if grace <= 0:
                    del self._tokens[t]
                else:
                    self._tokens[t] = (h, until if old_until is None else min(until, old_until))
        new = secrets.token_urlsafe(32)
        self._tokens[new] = (user, None)
        for path in self._token_files.get(user, []):
            write_atomically(path, new)
        return new

    def write_token_file(self, path: Path, user: str) -> None:
        """`user`'s token in `path`, rewritten on each rotation, as the kubelet keeps it projected."""
        write_atomically(path, self.token(user))
        self._token_files.setdefault(user, []).append(path)

    def authenticate(self, path: str, authorization: str) -> str | None:
        """The handle of the caller (None on a public path), or 401."""
        if path in PUBLIC_PATHS:
            return None
        scheme, _, token = authorization.partition(" ")
        found = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if found is None or (found[1] is not None and found[1] <= time.monotonic()):
            # Anonymous requests are refused too: a server run with --anonymous-auth=false.
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return found[0]

    def namespace_of(self, user: str) -> str:
        """A service account's namespace; "default" for anyone else."""
        username = self.info[user]["username"]
        parts = username.split(":")
        return parts[2] if username.startswith("system:serviceaccount:") and len(parts) == 4 else "default"


def pod_bound_user(
    username: str, *, node: str, pod: str, node_uid: str | None = None, pod_uid: str | None = None
) -> Json:
    """The user a pod-bound service-account token (TokenRequest, a projected token) authenticates
    as: the service account, and as extra the token's id and the pod and node it is bound to, with
    their uids (random ones when not given). The real server sets all five keys."""
    prefix = "authentication.kubernetes.io/"
    extra = {
        f"{prefix}credential-id": [f"JTI={uuid.uuid4()}"],
        f"{prefix}node-name": [node],
        f"{prefix}node-uid": [node_uid or str(uuid.uuid4())],
        f"{prefix}pod-name": [pod],
        f"{prefix}pod-uid": [pod_uid or str(uuid.uuid4())],
    }
    return {"username": username, "uid": str(uuid.uuid4()), "extra": extra}


def _user_info(info: Mapping[str, Any]) -> Json:
    out: Json = {
        "username": info["username"],
        "groups": list(info.get("groups") or []),
        "extra": copy.deepcopy(dict(info.get("extra") or {})),
    }
    if info.get("uid"):
        out["uid"] = info["uid"]
    parts = out["username"].split(":")
    if not out["groups"] and out["username"].startswith("system:serviceaccount:") and len(parts) == 4:
        out["groups"] = [
            "system:serviceaccounts",
            f"system:serviceaccounts:{parts[2]}",
            "system:authenticated",
        ]
    elif "system:authenticated" not in out["groups"]:
        out["groups"].append("system:authenticated")
    return out


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
