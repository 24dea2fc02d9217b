"""Kubernetes: Events on the affected Pods and the Node, and the Node conditions the agent owns.

What to report is decided in `planner` and `condition_plan` (pure); the rest makes the API calls, keeps
the state they need (the missing devices behind the conditions, the Events already created so a repeat
updates its series) in the outbox's key-value store, and turns the API server's answers into outcomes:

- 429 and 5xx are retried, 429's Retry-After honoured (through the delivery worker, like every sink);
- 409 on the node status (someone else wrote it since we read it) is re-read and re-applied;
- 401: the client re-reads the service-account token file (rotated about hourly) and tries again
  once; still refused, the delivery is retried later, as a rotation may be under way;
- an Event refused for good (422: a name the API server will not take; its namespace being
  deleted) is logged and skipped, never holding up the others; a refusal of our permissions (403) or
  of the condition write is permanent and its message says what to fix.
- a batch already applied (seq at or below the last one applied: redelivered, or a dead letter put
  back) is not applied again.

Requests go out at most `api_rate` per second, whatever the batch: the API server is shared by the
whole cluster. A batch that fails half-way is retried without creating its Events twice: the keys of
those already written are saved as they are written.

The client library (lightkube) is imported when the sink is first used, so an agent without this
sink pays nothing for it.

`settings` holds the sink's settings and their checks (the client, its configuration and its paced
requests are watcher.kubeapi's, shared with the sources that read the API), `refusals` an API
refusal as an outcome,
`planner` the Events and missing-device state a batch asks for, `condition_plan` what each owned
condition says, `notes` how their texts are bounded, `conditions` the condition writes and
their removal, `events` the Event writes, `sink` the sink itself and its one registration.
"""

from watcher.kubeapi.client import KubernetesError, connect
from watcher.kubeapi.settings import SERVICE_ACCOUNT_DIR
from watcher.sinks.kubernetes.conditions import remove_owned_conditions
from watcher.sinks.kubernetes.settings import KubernetesSinkSettings

# isort: split
# Last: importing it registers the sink type, and by then the package must be complete (other
# sink modules, which the registry imports meanwhile, may import from it).
from watcher.sinks.kubernetes.sink import KubernetesSink

__all__ = [
    "KubernetesSink",
    "KubernetesSinkSettings",
    "KubernetesError",
    "connect",
    "remove_owned_conditions",
    "SERVICE_ACCOUNT_DIR",
]
