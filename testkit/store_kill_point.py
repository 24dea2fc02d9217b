"""Run the watcher CLI with a kill point armed in the outbox store:

    python -m testkit.store_kill_point HOLD_DIR N -- run --config F

On the N-th outbox commit that carries events, after its rows are written and before
its COMMIT, the process writes HOLD_DIR/holding (the seqs it was committing and the WAL's
size) and waits to be killed. Its page cache is kept tiny, so those rows are already in
the WAL as uncommitted frames. The test then SIGKILLs it inside the transaction, where a real crash would
hurt the most. Both are the store's test hooks (watcher.store.hooks), installed before the CLI runs.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from watcher.cli import main
from watcher.model.events import Event
from watcher.store.hooks import StoreHooks, install_hooks

__all__ = ["arm"]


def arm(hold_dir: Path, nth: int) -> None:
    def connected(db: sqlite3.Connection) -> None:
        # A page cache of a few pages: a transaction of any size spills its pages into the
        # WAL before COMMIT, so a kill there leaves uncommitted frames for recovery to skip.
        db.execute("PRAGMA cache_size=4")

    count = 0

    def committing(db_path: Path, events: Sequence[Event]) -> None:
        nonlocal count
        if not events:
            return
        count += 1
        if count != nth:
            return
        wal = Path(str(db_path) + "-wal")
        seqs = [e.seq for e in events]
        (hold_dir / "holding").write_text(json.dumps({"seqs": seqs, "wal": wal.stat().st_size}))
        while True:  # inside the transaction, rows written, COMMIT not yet run
            time.sleep(1)

    install_hooks(StoreHooks(connected=connected, committing=committing))


if __name__ == "__main__":
    hold, n, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: python -m testkit.store_kill_point HOLD_DIR N -- ARGS..."
    arm(Path(hold), int(n))
    sys.exit(main(argv))
