"""The watcher CLI with the nats sink's kill point armed.

    python -m testkit.nats_kill_point HOLD_DIR N -- run -c CONFIG

On the N-th delivery the stream acknowledged, before the worker can acknowledge it to the
outbox, the process writes HOLD_DIR/published (the seqs it published) and stops its event loop
(a blocking sleep) until it is killed: the point where a crash leaves events in the stream that
the outbox still holds. The sink type is replaced through the registry's public seam.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from watcher.cli import main
from watcher.model.events import Event
from watcher.sinks import registry
from watcher.sinks.base import Outcome, SinkContext
from watcher.sinks.nats import NatsSink, NatsSinkSettings

__all__ = ["arm"]


def arm(hold_dir: Path, nth: int) -> None:
    count = 0

    class Held(NatsSink):
        async def deliver(self, events: Sequence[Event]) -> Outcome:
            nonlocal count
            outcome = await super().deliver(events)
            if outcome.delivered:
                count += 1
                if count == nth:
                    (hold_dir / "published").write_text(json.dumps([e.seq for e in events]))
                    while True:  # the loop stops here: no outbox ack can happen before the kill
                        time.sleep(1)  # noqa: ASYNC251 (blocking the loop is the point)
            return outcome

    def factory(settings: NatsSinkSettings, context: SinkContext) -> NatsSink:
        return Held(settings, node=context.node)

    original = registry.find("nats")
    assert original is not None
    registry.unregister("nats")
    registry.register(dataclasses.replace(original, factory=factory))


if __name__ == "__main__":
    hold, n, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: python -m testkit.nats_kill_point HOLD_DIR N -- ARGS..."
    arm(Path(hold), int(n))
    sys.exit(main(argv))
