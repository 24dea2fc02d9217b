"""The key-value table: small JSON values a sink keeps across restarts (the Alertmanager sink's alerts)."""

from __future__ import annotations

import json
from typing import Any

from watcher.store.outbox.connection import Connection

__all__ = ["KeyValueTable"]


class KeyValueTable:
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def get(self, key: str) -> Any:
        row = self._conn.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set(self, key: str, value: Any) -> None:
        with self._conn.tx() as db:
            db.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value, separators=(",", ":"))),
            )
