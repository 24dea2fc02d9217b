"""Publishing a batch of events into the stream, in order, with up to `max_in_flight`
acknowledgements outstanding, and saying how far it got."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from watcher.model.events import Event
from watcher.secrets import redact
from watcher.sinks.nats.acks import Acks
from watcher.sinks.nats.settings import NatsSinkSettings
from watcher.sinks.nats.stream import ensure_stream
from watcher.sinks.nats.subjects import message_headers, subject_for, wire_size

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.aio.client

__all__ = ["Publisher", "Published", "Publishing", "publisher_for"]


class Publishing(Protocol):
    """What publishes for a Publisher: `Acks` (the sink's), or nats-py's JetStream context."""

    async def publish_async(
        self, subject: str, payload: bytes, *, stream: str, headers: dict[str, str]
    ) -> asyncio.Future[Any]: ...


@dataclass(frozen=True)
class Published:
    """How a publish of a batch went: the first `done` events are stored (acknowledged);
    `duplicates` of them the server already had; `error` stopped the rest (`oversized`: the event
    after the stored ones can never be published as it is)."""

    done: int
    duplicates: int = 0
    error: str = ""
    oversized: bool = False
    # The publisher should be made afresh: a publish raised (nats-py's own context keeps the slot
    # of one that raised, never given back), or no stream answered (deleted? check it again).
    stale: bool = False


_RETRYABLE_HINT = "the cluster may be electing a stream leader or unreachable; retried"


class Publisher:
    """Publishes events in order with up to `max_in_flight` acknowledgements outstanding.

    Separate from the connection (the sink owns one; a load generator shares a few among many
    simulated nodes), so what is measured is what the agent runs.
    """

    def __init__(
        self,
        js: Publishing,
        *,
        stream: str,
        prefix: str,
        timeout: float,
        max_in_flight: int,
        max_payload: int,
    ) -> None:
        self.js = js
        self.stream = stream
        self.prefix = prefix
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.max_payload = max_payload

    async def publish(self, events: Sequence[Event]) -> Published:
        loop = asyncio.get_running_loop()
        window: deque[tuple[asyncio.Future[Any], float]] = deque()
        run = _Run()
        raised = ""
        try:
            for event in events:
                payload = json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False).encode()
                headers = message_headers(event)
                size = wire_size({**headers, "Nats-Expected-Stream": self.stream}, payload)
                if size > self.max_payload:
                    # Settle what went before it, then say it can never go as it is.
                    while window:
                        await self._settle(window.popleft(), run)
                    run.fail(
                        f"event seq {event.seq} is {size} bytes with its headers, over the server's "
                        f"max_payload of {self.max_payload}",
                        oversized=True,
                    )
                    break
                while len(window) >= self.max_in_flight:
                    await self._settle(window.popleft(), run)
                if run.error or any(f.done() and (f.cancelled() or f.exception()) for f, _ in window):
                    break  # a failure in the window: publishing more would only be sent again
                # Bounded by our own timeout, not the client's `wait_stall`: that wraps every
                # publish in a wait_for, which on Python 3.11 costs a task per message and can
                # lose a cancel (a stopping agent would go on publishing its batch).
                async with asyncio.timeout(self.timeout):
                    future = await self.js.publish_async(
                        subject_for(self.prefix, event), payload, stream=self.stream, headers=headers
                    )
                window.append((future, loop.time() + self.timeout))
        except TimeoutError:  # its slots all taken, or its buffer full while reconnecting
            raised = f"could not publish within {self.timeout:g} s: the client is stalled; {_RETRYABLE_HINT}"
        except Exception as err:  # the client's: closed, its buffer full while reconnecting
            raised = redact(f"could not publish: {type(err).__name__}: {err}")
        finally:
            # The acknowledgements already on their way still count.
            while window:
                await self._settle(window.popleft(), run)
        if raised:
            run.fail(raised)
            run.stale = True
        return Published(
            done=run.done,
            duplicates=run.duplicates,
            error=run.error,
            oversized=run.oversized,
            stale=run.stale,
        )

    async def _settle(self, sent: tuple[asyncio.Future[Any], float], run: _Run) -> None:
        """Wait for one publish's acknowledgement (until its deadline) and count it in `run`."""
        import nats.errors
        import nats.js.errors

        future, deadline = sent
        try:
            async with asyncio.timeout_at(deadline):
                ack = await asyncio.shield(future)
        except TimeoutError:
            future.cancel()  # frees the client's slot for it
            run.fail(f"no acknowledgement within {self.timeout:g} s: {_RETRYABLE_HINT}")
        except nats.js.errors.NoStreamResponseError:
            run.fail(f"no stream answered (no responders): {_RETRYABLE_HINT}")
            run.stale = True
        except nats.js.errors.APIError as err:
            run.fail(redact(_refused(err)), oversized=err.err_code == _MAX_MSG_SIZE)
        except (nats.errors.Error, OSError) as err:
            run.fail(redact(f"{type(err).__name__}: {err}"))
        else:
            if ack.stream != self.stream:
                # Only a responder other than the stream answers so: the server itself refuses a
                # publish that another stream would capture (Nats-Expected-Stream).
                run.fail(
                    redact(
                        f"an acknowledgement from stream {ack.stream[:100]!r}, not {self.stream}: something "
                        "other than the stream answers on its subjects; retried"
                    )
                )
            else:
                run.stored(bool(ack.duplicate))

    async def close(self) -> None:
        """Stop listening for acknowledgements (the sink's own `Acks`; others have nothing to stop)."""
        if isinstance(self.js, Acks):
            await self.js.close()


@dataclass
class _Run:
    """A batch's publish as it goes: only the unbroken run of acknowledgements from its start
    counts as done (an event stored after one that failed is sent again; the server drops it)."""

    done: int = 0
    duplicates: int = 0
    error: str = ""
    oversized: bool = False
    stale: bool = False

    def stored(self, duplicate: bool) -> None:
        if not self.error:
            self.done += 1
            self.duplicates += duplicate

    def fail(self, error: str, *, oversized: bool = False) -> None:
        if not self.error:
            self.error, self.oversized = error, oversized


# JetStream's error codes: a message over the stream's max_msg_size; a message the stream could
# not store (a stream that discards new messages is full, or its store failed).
_MAX_MSG_SIZE = 10054
_STORE_FAILED = 10077


def _refused(err: Any) -> str:
    """What a refusal in an acknowledgement means, and what it asks for."""
    said = f"{err.description} (code {err.err_code})"
    if err.err_code == _STORE_FAILED:
        return (
            f"the stream could not store it: {said}: a stream with discard=new is full (raise its "
            "max_msgs/max_bytes, or let it discard old messages) or its store failed; retried"
        )
    if err.err_code == _MAX_MSG_SIZE:
        return (
            f"the stream refused it: {said}: over the stream's max_msg_size, it can never be stored as it is"
        )
    return f"the stream refused it: {said}; retried"


async def publisher_for(nc: nats.aio.client.Client, settings: NatsSinkSettings, node: str) -> Publisher:
    """A fresh JetStream context on `nc` with the stream checked (`ensure_stream`), and its Publisher."""
    s = settings
    await ensure_stream(nc.jetstream(timeout=s.timeout), s, node)
    return Publisher(
        Acks(nc, max_pending=s.max_in_flight),
        stream=s.stream,
        prefix=s.subject_prefix,
        timeout=s.timeout,
        max_in_flight=s.max_in_flight,
        max_payload=nc.max_payload,
    )
