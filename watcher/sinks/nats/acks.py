"""Publishing into JetStream with its acknowledgements read by us, every answer one outcome.

nats-py's own `publish_async` raises inside its subscription callback when an acknowledgement
carries an error (`APIError.from_error` raises rather than returns): the publish never resolves,
so a refusal (an event over the stream's max_msg_size, a full stream) looked like a lost
acknowledgement, retried for ever, and the client reported the raise as a connection error. Here
the answer is read as data: an acknowledgement, a refusal, no responders, or something that is no
acknowledgement at all, and never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.aio.client
    import nats.aio.msg
    import nats.aio.subscription
    import nats.js.api

__all__ = ["Acks", "read_ack"]

# How much of what a peer says an error or a log line shows: an answer is up to max_payload long.
_SHOWN = 200


def _shown(text: object) -> str:
    text = str(text)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def read_ack(data: bytes, headers: dict[str, str] | None) -> nats.js.api.PubAck | Exception:
    """What an answer to a publish says: its acknowledgement, or the error it stands for."""
    import nats.js.api
    import nats.js.errors

    if headers and headers.get("Status") == "503":
        return nats.js.errors.NoStreamResponseError()
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return nats.js.errors.APIError(
            description=f"an answer that is no JetStream acknowledgement: {_shown(data)}"
        )
    error = answer.get("error")
    if error is not None:
        if not isinstance(error, dict):
            return nats.js.errors.APIError(description=_shown(error))
        code, err_code = error.get("code"), error.get("err_code")
        kind = {
            503: nats.js.errors.ServiceUnavailableError,
            500: nats.js.errors.ServerError,
            404: nats.js.errors.NotFoundError,
            400: nats.js.errors.BadRequestError,
        }.get(code if isinstance(code, int) else 0, nats.js.errors.APIError)
        return kind(
            code=code if isinstance(code, int) else None,
            err_code=err_code if isinstance(err_code, int) else None,
            description=_shown(error.get("description", "")),
        )
    stream, seq = answer.get("stream"), answer.get("seq")
    if not isinstance(stream, str) or not isinstance(seq, int) or isinstance(seq, bool):
        return nats.js.errors.APIError(
            description=f"an acknowledgement without stream and seq: {_shown(data)}"
        )
    return nats.js.api.PubAck(stream=stream, seq=seq, duplicate=answer.get("duplicate") is True)


class Acks:
    """Publishes whose acknowledgements come to one inbox of ours: up to `max_pending` at once,
    each a future that the answer (or the caller's cancel, which frees its slot) settles."""

    def __init__(self, nc: nats.aio.client.Client, *, max_pending: int) -> None:
        self.nc = nc
        self._slots = asyncio.Semaphore(max_pending)
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._prefix = ""
        self._sub: nats.aio.subscription.Subscription | None = None
        self._count = 0

    async def publish_async(
        self, subject: str, payload: bytes, *, stream: str, headers: dict[str, str]
    ) -> asyncio.Future[Any]:
        """Publish with the stream it must land in; a future for its acknowledgement."""
        if self._sub is None:
            self._prefix = f"{self.nc.new_inbox()}."
            self._sub = await self.nc.subscribe(f"{self._prefix}*", cb=self._answer)
        await self._slots.acquire()
        self._count += 1
        token = str(self._count)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        future.add_done_callback(lambda _: self._settled(token))
        try:
            await self.nc.publish(
                subject,
                payload,
                reply=self._prefix + token,
                headers={**headers, "Nats-Expected-Stream": stream},
            )
        except BaseException:
            future.cancel()  # its slot back: unlike nats-py's, a publish that raised holds none
            raise
        return future

    def _settled(self, token: str) -> None:
        self._waiting.pop(token, None)
        self._slots.release()

    async def _answer(self, msg: nats.aio.msg.Msg) -> None:
        future = self._waiting.get(msg.subject[len(self._prefix) :])
        if future is None or future.done():
            return  # late: given up on (timed out) already
        reply = read_ack(msg.data, msg.headers)
        if isinstance(reply, Exception):
            future.set_exception(reply)
        else:
            future.set_result(reply)

    async def close(self) -> None:
        """Stop listening for acknowledgements; what still waits for one is cancelled."""
        sub, self._sub = self._sub, None
        for future in list(self._waiting.values()):
            future.cancel()
        if sub is not None and not self.nc.is_closed:
            # The connection may go meanwhile: nothing left to unsubscribe from then.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
