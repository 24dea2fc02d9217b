"""Run the watcher CLI with a kill point armed: `python -m tests.kill_point HOLD_DIR N -- run --config F`.

On the N-th outbox commit that carries events, after its rows are written and before
its COMMIT, the process writes HOLD_DIR/holding (the seqs it was committing and the WAL's
size) and waits to be killed. Its page cache is kept tiny, so those rows are already in
the WAL as uncommitted frames. The test then SIGKILLs it inside the transaction, where a real crash would
hurt the most. Test code only: the package has no hook of this kind.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from watcher.cli import main
from watcher.store import outbox


def arm(hold_dir: Path, nth: int) -> None:
    original_connect = outbox.Outbox._connect
    original_commit = outbox.Outbox.sync_commit

    def connect(self: outbox.Outbox) -> Any:
        db = original_connect(self)
        # A page cache of a few pages: a transaction of any size spills its pages into the
        # WAL before COMMIT, so a kill there leaves uncommitted frames for recovery to skip.
        db.execute("PRAGMA cache_size=4")
        return db

    original_exit = outbox._Transaction.__exit__
    state = threading.local()
    count = 0

    def sync_commit(self: outbox.Outbox, events: Any, queues: Any, state_doc: Any) -> None:
        nonlocal count
        if events:
            count += 1
        state.holding = [e.seq for e in events] if events and count == nth else None
        state.db_path = self.path
        try:
            original_commit(self, events, queues, state_doc)
        finally:
            state.holding = None

    def exit_(self: Any, exc_type: object, exc: object, tb: object) -> None:
        seqs = getattr(state, "holding", None)
        if seqs is not None and exc_type is None:
            wal = Path(str(state.db_path) + "-wal")
            (hold_dir / "holding").write_text(json.dumps({"seqs": seqs, "wal": wal.stat().st_size}))
            while True:  # inside the transaction, rows written, COMMIT not yet run
                time.sleep(1)
        original_exit(self, exc_type, exc, tb)

    outbox.Outbox._connect = connect  # type: ignore[method-assign]
    outbox.Outbox.sync_commit = sync_commit  # type: ignore[method-assign]
    outbox._Transaction.__exit__ = exit_  # type: ignore[method-assign]


if __name__ == "__main__":
    hold, n, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: python -m tests.kill_point HOLD_DIR N -- ARGS..."
    arm(Path(hold), int(n))
    sys.exit(main(argv))
