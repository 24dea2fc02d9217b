"""NATS JetStream: every event published into a stream that a fleet's consumers read from.

One agent runs per node; inventory systems read thousands of nodes. Instead of every node posting
webhooks to one receiver, each publishes into a clustered, persistent, replayable JetStream stream:

- subject `<subject_prefix>.<node>.<kind>` (the node's dots become `_`: a subject token has none;
  the kind keeps its dot, so `PREFIX.*.device.>` selects the device events of every node);
- header `Nats-Msg-Id` = the event id: a re-publish (after a lost acknowledgement, a retry, an agent
  killed between publish and outbox ack) is dropped by the server within the stream's duplicate
  window; headers `Prw-Schema`, `Prw-Seq`, `Prw-Node`, `Prw-Kind`; the payload is the event's JSON;
- an event leaves the outbox only once the stream acknowledged it (`done` says how far a batch
  got, so what was stored before a failure is not sent again);
- up to `max_in_flight` publishes await their acknowledgements at once. With 1 (the default) a
  node's events are stored in seq order even across a leader failover; with more, a publish that
  fails while later ones succeed is stored after them on its retry, so consumers must order by
  `Prw-Seq` (each event carries its seq);
- the client reconnects on its own; authentication by token, user and password, NKey seed or
  creds file, from files or the environment and never printed; TLS with a CA and client certificates.

Events from `send-test` (their details say `"test": true`) go to `<prefix>.<node>.send-test`, so
consumers of `PREFIX.*.device.>` never take a test for a failed device.

The client library (nats-py) is imported when the sink is first used, so an agent without this
sink pays nothing for it.

`settings` holds the sink's settings and their checks, `subjects` where an event goes and what
travels with it (pure), `connection` the client, `stream` the stream's checks, `acks` the
publishes whose acknowledgements the sink reads itself, `publisher` the publishing of a batch,
`sink` the sink itself and its one registration.
"""

from watcher.sinks.nats.acks import Acks, read_ack
from watcher.sinks.nats.connection import ConnectionLog, connect
from watcher.sinks.nats.publisher import Published, Publisher, publisher_for
from watcher.sinks.nats.settings import NatsSinkSettings
from watcher.sinks.nats.stream import StreamError, ensure_stream
from watcher.sinks.nats.subjects import message_headers, node_token, subject_for, wire_size

# isort: split
# Last: importing it registers the sink type, and by then the package must be complete (other
# sink modules, which the registry imports meanwhile, may import from it).
from watcher.sinks.nats.sink import NatsSink

__all__ = [
    "NatsSink",
    "NatsSinkSettings",
    "Publisher",
    "Acks",
    "read_ack",
    "Published",
    "StreamError",
    "ConnectionLog",
    "connect",
    "publisher_for",
    "ensure_stream",
    "node_token",
    "subject_for",
    "message_headers",
    "wire_size",
]
