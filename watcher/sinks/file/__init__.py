"""The audit log of device churn: append-only JSONL, tamper-evident, rotated by size.

Each record carries the hash of the one before it and the chain continues
across rotations and agent restarts (see `watcher.sinks.audit`); with a `key`
each hash is an HMAC, so the chain cannot be recomputed without the key. The
worker hands the sink up to `max_batch` events at once: they are written with
one write and one fsync (and acked in one outbox transaction), then the head
file beside the log is replaced, once per batch, with the last record's n and
hash, which is what shows a cut tail. Delivery is in seq order, so an event
the log already holds (re-sent after a crash) is skipped: the log itself holds
each event once. Events the queue's caps dropped before they were written are
recorded as a gap record where they would have been (`record_gap`).

The log and its rotated files are private (0600, whatever the umask) and never written through
a symbolic link (see `watcher.files`): a link at `path` is refused with an error naming it, the
event stays queued, and the link's target is left as it was.

`settings` holds the sink's settings and their checks, `writer` the log on disk (batches,
rotation, the torn tail, the head file), `sink` the sink itself and its one registration.
"""

from watcher.sinks.file.settings import MIN_KEY_CHARS, FileSinkSettings
from watcher.sinks.file.writer import AuditLogWriter

# isort: split
# Last: importing it registers the sink type, and by then the package must be complete (other
# sink modules, which the registry imports meanwhile, may import from it).
from watcher.sinks.file.sink import FileSink

__all__ = ["FileSink", "FileSinkSettings", "AuditLogWriter", "MIN_KEY_CHARS"]
