"""The durable outbox: events, per-sink queues, dead letters and state in SQLite, behind one async
facade (`Store`) that also knows whether anything can be stored (`StorageHealth`)."""
