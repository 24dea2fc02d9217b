"""The durable outbox: SQLite (WAL) in the state directory.

Events, the per-sink queues and the watcher's state are committed in ONE
transaction, so the state can never move past an event that is not safely
queued, and a crash re-sends rather than loses (or re-invents under a new id).
Each sink drains its own queue in `seq` order; delivered rows are deleted,
permanent failures move to a dead-letter table that is kept until an operator
retries or drops them, or its caps do. Queues and dead letters are bounded by
count and by age (on the age clock, `watcher.store.ages`, which no wall-clock
step moves): the oldest rows go first, every drop is counted, and for a sink
that records gaps in its stream (the audit log) a gap row says what it lost.

What an ack, a commit and a cap costs does not grow with what is queued: every
statement on those paths is an index search (a test checks their query plans),
an event is pruned when the ack or drop that may have released it says so (never
by scanning the table), and each sink's depth and dead letters are counted in
its `sinks` row.

`OutboxDatabase` is the database itself, synchronous: it runs on whichever thread
calls it (the `outbox` command calls it directly). The agent reaches it through
`watcher.store.store.Store`, which runs all of its work on one dedicated thread:
sqlite3 is blocking, and fsyncs must never stall the event loop.

Its modules, one concern each: `connection` (opening the file privately, a corrupt
one moved aside), `schema` (the numbered migrations), `transaction`, `queues`,
`caps`, `gaps`, `dead_letters`, `sinks` (each sink's row and figures), `kv`, and
`database` (`OutboxDatabase`, which holds them together).
"""

from watcher.store.outbox.caps import Caps, Dropped, Enforced
from watcher.store.outbox.connection import OUTBOX_FILE, OutboxUnavailableError
from watcher.store.outbox.database import OutboxDatabase
from watcher.store.outbox.dead_letters import DeadLetter
from watcher.store.outbox.sinks import SinkStats

__all__ = [
    "OutboxDatabase",
    "OUTBOX_FILE",
    "OutboxUnavailableError",
    "DeadLetter",
    "SinkStats",
    "Caps",
    "Dropped",
    "Enforced",
]
