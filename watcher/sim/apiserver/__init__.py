"""A fake Kubernetes API server on loopback that holds clients to the real server's contract: the
`demo --kubernetes` server and the tests' (see `server` for what it serves and enforces)."""

from watcher.sim.apiserver.decoding import SchemaCheck, SchemaViolation
from watcher.sim.apiserver.kubectl import kubectl
from watcher.sim.apiserver.rbac import Grant, grants_for, shipped_rbac
from watcher.sim.apiserver.server import ADMIN, FakeApiServer, RequestRecord
from watcher.sim.apiserver.users import pod_bound_user
from watcher.sim.apiserver.values import micro_time

__all__ = [
    "ADMIN",
    "FakeApiServer",
    "Grant",
    "RequestRecord",
    "SchemaCheck",
    "SchemaViolation",
    "grants_for",
    "kubectl",
    "micro_time",
    "pod_bound_user",
    "shipped_rbac",
]
