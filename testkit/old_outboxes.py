"""Outbox files as older releases wrote them, for the upgrade tests: the schema each version added.

Written out here on purpose rather than read from watcher/store/outbox/schema.py: what an old
release put on disk must not change when the migrations are edited.
"""

from __future__ import annotations

__all__ = ["BEFORE_THE_NUMBERING", "HISTORY"]

# What each version added, in order: the file at user_version N has the tables of 1..N.
HISTORY: dict[int, str] = {
    1: """
        CREATE TABLE events (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, created REAL NOT NULL,
            body TEXT NOT NULL);
        CREATE TABLE queue (sink TEXT NOT NULL, seq INTEGER NOT NULL, enqueued REAL NOT NULL,
            PRIMARY KEY (sink, seq)) WITHOUT ROWID;
        CREATE INDEX queue_seq ON queue (seq);
        CREATE TABLE dead_letters (sink TEXT NOT NULL, seq INTEGER NOT NULL, failed REAL NOT NULL,
            status INTEGER, error TEXT NOT NULL, PRIMARY KEY (sink, seq)) WITHOUT ROWID;
        CREATE INDEX dead_letters_seq ON dead_letters (seq);
        CREATE TABLE sinks (name TEXT PRIMARY KEY, disabled TEXT, delivered INTEGER NOT NULL DEFAULT 0,
            dropped INTEGER NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    2: """
        ALTER TABLE queue ADD COLUMN since REAL NOT NULL DEFAULT 0;
        ALTER TABLE dead_letters ADD COLUMN since REAL NOT NULL DEFAULT 0;
        CREATE TABLE clock (id INTEGER PRIMARY KEY CHECK (id = 1), boot TEXT NOT NULL,
            boottime REAL NOT NULL, age REAL NOT NULL);
        CREATE INDEX queue_since ON queue (sink, since);
        CREATE INDEX dead_letters_since ON dead_letters (sink, since);
    """,
    3: """
        ALTER TABLE sinks ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE sinks ADD COLUMN dead_kept INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE sinks ADD COLUMN dead_dropped INTEGER NOT NULL DEFAULT 0;
    """,
    4: """
        CREATE TABLE gaps (sink TEXT NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
            count INTEGER NOT NULL, reasons TEXT NOT NULL, time REAL NOT NULL,
            PRIMARY KEY (sink, first)) WITHOUT ROWID;
    """,
    5: """
        CREATE TABLE saved_state (part TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE saved_pods (namespace TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY (namespace, name));
    """,
}


# The file the code before the numbering made (user_version 0), statement for statement.
BEFORE_THE_NUMBERING = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    sink TEXT NOT NULL,
    seq INTEGER NOT NULL,
    enqueued REAL NOT NULL,
    since REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
    sink TEXT NOT NULL,
    seq INTEGER NOT NULL,
    failed REAL NOT NULL,
    status INTEGER,
    error TEXT NOT NULL,
    since REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sinks (
    name TEXT PRIMARY KEY,
    disabled TEXT,
    delivered INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0,
    dead INTEGER NOT NULL DEFAULT 0,
    queued INTEGER NOT NULL DEFAULT 0,
    dead_kept INTEGER NOT NULL DEFAULT 0,
    dead_dropped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS gaps (
    sink TEXT NOT NULL,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    count INTEGER NOT NULL,
    reasons TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (sink, first)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot TEXT NOT NULL,
    boottime REAL NOT NULL,
    age REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saved_state (
    part TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saved_pods (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX IF NOT EXISTS queue_seq ON queue (seq);
CREATE INDEX IF NOT EXISTS queue_since ON queue (sink, since);
CREATE INDEX IF NOT EXISTS dead_letters_seq ON dead_letters (seq);
CREATE INDEX IF NOT EXISTS dead_letters_since ON dead_letters (sink, since);
"""
