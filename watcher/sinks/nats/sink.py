"""The nats sink: one connection and its Publisher, made when first needed and made again when
they go stale, and the NATS client's failures as outcomes the delivery worker retries."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from watcher.model.events import Event
from watcher.secrets import redact
from watcher.sinks.base import Capabilities, Outcome, SinkContext
from watcher.sinks.nats.connection import ConnectionLog, abort_socket, connect
from watcher.sinks.nats.publisher import Publisher, publisher_for
from watcher.sinks.nats.settings import NatsSinkSettings, check_settings
from watcher.sinks.nats.stream import StreamError
from watcher.sinks.registry import SinkType, register

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.aio.client

__all__ = ["NatsSink", "CLOSE_GRACE_S"]

log = structlog.get_logger("watcher.sinks.nats")

# What an agent's stop leaves a sink to close in: of its 15 s (TimeoutStopSec,
# terminationGracePeriodSeconds), the tasks' grace (5 s) goes first and the outbox closes last.
CLOSE_GRACE_S = 5.0


class NatsSink:
    def __init__(self, settings: NatsSinkSettings, *, node: str) -> None:
        self.name = settings.name
        self.settings = settings
        self.node = node
        self._nc: nats.aio.client.Client | None = None
        self._publisher: Publisher | None = None
        self._lock = asyncio.Lock()
        self._notes = ConnectionLog()

    async def _ready(self) -> Publisher:
        if self._nc is not None and self._nc.is_closed:
            self._nc, self._publisher = None, None
        if self._publisher is not None:
            return self._publisher
        s = self.settings
        if self._nc is None:
            self._nc = await connect(s, name=f"pod-resources-watcher/{self.node}", notes=self._notes)
        self._publisher = await publisher_for(self._nc, s, self.node)
        return self._publisher

    async def deliver(self, events: Sequence[Event]) -> Outcome:
        import nats.errors
        import nats.js.errors

        async with self._lock:
            self._notes.last = ""
            try:
                publisher = await self._ready()
            except StreamError as err:
                return Outcome(retry=True, error=str(err))
            except nats.js.errors.APIError as err:
                why = f"{err.description} (code {err.err_code})"
                return Outcome(retry=True, error=redact(f"the stream's API refused: {why}: retried"))
            except nats.errors.AuthorizationError:
                why = "NATS refused the sink's credentials (authorization failed): retried"
                return Outcome(retry=True, error=why)
            except (nats.errors.Error, OSError, TimeoutError) as err:
                why = str(err) or type(err).__name__
                if self._nc is not None and self._nc.is_connected:
                    problem = f"no answer from the stream's API ({why})"
                else:
                    problem = f"cannot reach NATS ({why})"
                return Outcome(retry=True, error=redact(self._explained(f"{problem}: retried")))
            assert self._nc is not None
            if not self._nc.is_connected:
                # Publishing now would only fill the client's reconnect buffer with copies that
                # the retry sends again anyway.
                return Outcome(
                    retry=True, error="not connected to NATS (the client is reconnecting): retried"
                )
            result = await publisher.publish(events)
            if result.stale:
                self._publisher = None  # a fresh one, and the stream checked again, next time
                await publisher.close()
        if result.duplicates:
            log.info(
                "the stream already had some of these events (a re-publish after a lost "
                "acknowledgement or a restart); the server dropped the copies",
                sink=self.name,
                duplicates=result.duplicates,
            )
        if result.done == len(events):
            return Outcome.ok()
        # Nothing is refused for good but an event too big for the server: the rest (no leader,
        # no stream yet, a full stream, a permission not granted yet) is retried until it clears.
        return Outcome(retry=not result.oversized, error=self._explained(result.error), done=result.done)

    def _explained(self, error: str) -> str:
        """`error`, with what the server said meanwhile that explains it (a refused permission)."""
        return f"{error}; the server said: {self._notes.last}" if self._notes.last else error

    def background(self) -> None:
        return None

    async def close(self) -> None:
        """Close the connection within `CLOSE_GRACE_S` (or the sink's timeout, if shorter), even
        against a server that hangs; what it still held is dropped (the outbox keeps every event
        not acknowledged, sent again at the next start and deduplicated by the server)."""
        nc, self._nc, self._publisher = self._nc, None, None
        if nc is None:
            return
        # Not drain(): by now the worker has settled every publish, so there is nothing to wait
        # for, and drain() swallows a cancel and then waits out its own flush (10 s) on a hung
        # server. close() is waited on, never cancelled: past the grace the socket is cut.
        closing = asyncio.ensure_future(nc.close())
        closing.add_done_callback(_retrieved)
        await asyncio.wait({closing}, timeout=min(self.settings.timeout, CLOSE_GRACE_S))
        if not closing.done():
            abort_socket(nc)
            await asyncio.wait({closing}, timeout=0.5)
            closing.cancel()


def _retrieved(task: asyncio.Future[None]) -> None:
    """A close's failure is no news: the connection is gone either way."""
    if not task.cancelled():
        task.exception()


def _nats_sink(settings: NatsSinkSettings, context: SinkContext) -> NatsSink:
    return NatsSink(settings, node=context.node)


register(
    SinkType(
        name="nats",
        settings=NatsSinkSettings,
        factory=_nats_sink,
        validate=check_settings,
        capabilities=Capabilities(batches=True),
        order=90,
    )
)
