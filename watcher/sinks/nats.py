"""NATS JetStream: every event published into a stream that a fleet's consumers read from.

One agent runs per node; inventory systems read thousands of nodes. Instead of every node posting
webhooks to one receiver, each publishes into a clustered, persistent, replayable JetStream stream:

- subject `<subject_prefix>.<node>.<kind>` (the node's dots become `_`: a subject token has none;
  the kind keeps its dot, so `PREFIX.*.device.>` selects the device events of every node);
- header `Nats-Msg-Id` = the event id: a re-publish (after a lost acknowledgement, a retry, an agent
  killed between publish and outbox ack) is dropped by the server within the stream's duplicate
  window; headers `Prw-Schema`, `Prw-Seq`, `Prw-Node`, `Prw-Kind`; the payload is the event's JSON;
- an event leaves the outbox only once the stream acknowledged it (`done` says how far a batch
  got, so what was stored before a failure is not sent again);
- up to `max_in_flight` publishes await their acknowledgements at once. With 1 (the default) a
  node's events are stored in seq order even across a leader failover; with more, a publish that
  fails while later ones succeed is stored after them on its retry, so consumers must order by
  `Prw-Seq` (each event carries its seq);
- the client reconnects on its own; authentication by token, user and password, NKey seed or
  creds file, from files or the environment and never printed; TLS with a CA and client certificates.

Events from `send-test` (their details say `"test": true`) go to `<prefix>.<node>.send-test`, so
consumers of `PREFIX.*.device.>` never take a test for a failed device.

The client library (nats-py) is imported when the sink is first used, so an agent without this
sink pays nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog

from watcher.config import ConfigError, field_meta
from watcher.model.events import SCHEMA_VERSION, Event
from watcher.secrets import Secret, redact, redact_url, remember_url_credentials
from watcher.sinks.base import BaseSinkSettings, Capabilities, Outcome, SinkContext, check_client_files
from watcher.sinks.registry import SinkType, register
from watcher.tls import client_context

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.aio.client
    import nats.js.client

__all__ = [
    "NatsSink",
    "NatsSinkSettings",
    "Publisher",
    "Published",
    "StreamError",
    "ConnectionLog",
    "connect",
    "publisher_for",
    "ensure_stream",
    "node_token",
    "subject_for",
    "message_headers",
]

log = structlog.get_logger("watcher.sinks.nats")

_DAY = 86400.0


@dataclass(frozen=True)
class NatsSinkSettings(BaseSinkSettings):
    servers: tuple[str, ...] = field(
        default=("nats://127.0.0.1:4222",),
        metadata=field_meta(
            "NATS server URLs (nats:// or tls://); the client tries them in turn and reconnects on "
            "its own. Credentials in a URL are never printed, but prefer the auth keys below."
        ),
    )
    subject_prefix: str = field(
        default="pod-resources",
        metadata=field_meta("Subjects are PREFIX.NODE.KIND (the node's dots become _)."),
    )
    stream: str = field(
        default="POD_RESOURCES",
        metadata=field_meta(
            "The JetStream stream the events must land in (each publish says so: one that another "
            "stream captures fails instead)."
        ),
    )
    create_stream: bool = field(
        default=False,
        metadata=field_meta(
            "Create the stream when it is missing (subjects PREFIX.>, file storage, stream_replicas, "
            "duplicate_window, stream_max_age); off: expect it provisioned, and retry until it is."
        ),
    )
    stream_replicas: int = field(
        default=3, metadata=field_meta("Replicas of a stream this sink creates.", min=1, max=5)
    )
    duplicate_window: float = field(
        default=_DAY,
        metadata=field_meta(
            "Duplicate window of a stream this sink creates, seconds: at least max_age, so a "
            "re-publish of anything the outbox still holds is dropped by the server.",
            min=1,
            max=30 * _DAY,
        ),
    )
    stream_max_age: float = field(
        default=14 * _DAY,
        metadata=field_meta(
            "How long a stream this sink creates keeps events, seconds (0: until its limits).",
            min=0,
        ),
    )
    max_in_flight: int = field(
        default=1,
        metadata=field_meta(
            "Publishes awaiting their acknowledgement at once. 1 keeps a node's events in seq order "
            "in the stream even across a failover; more is faster, and a retried event may then land "
            "after later ones (consumers order by the Prw-Seq header).",
            min=1,
            max=4000,
        ),
    )
    timeout: float = field(
        default=5.0,
        metadata=field_meta(
            "Seconds to wait for a connection, for the client to take a publish, or for its "
            "acknowledgement, before retrying.",
            min=0.1,
            max=300,
        ),
    )
    token: Secret | None = field(default=None, metadata=field_meta("Auth token (secret).", secret=True))
    user: str | None = field(default=None, metadata=field_meta("User name; goes with password."))
    password: Secret | None = field(
        default=None, metadata=field_meta("Password of `user` (secret).", secret=True)
    )
    nkey_seed: Secret | None = field(
        default=None,
        metadata=field_meta("NKey user seed, SU... (secret): the server knows its public key.", secret=True),
    )
    creds_file: Path | None = field(
        default=None,
        metadata=field_meta(
            "A .creds file (user JWT and NKey seed), for servers in operator mode.", private=True
        ),
    )
    ca_file: Path | None = field(
        default=None, metadata=field_meta("CA bundle to verify the servers with (TLS is then required).")
    )
    cert_file: Path | None = field(
        default=None, metadata=field_meta("Client certificate (PEM) for mutual TLS.")
    )
    key_file: Path | None = field(
        default=None, metadata=field_meta("Client key (PEM) for mutual TLS.", private=True)
    )
    # Batches: the worker hands up to max_batch events to one delivery, published back to back.
    max_batch: int = field(
        default=256, metadata=field_meta("Most events handed to one delivery.", min=1, max=10000)
    )
    rate: float = field(
        default=100.0, metadata=field_meta("Most deliveries per second.", min=0.001, max=10000)
    )
    max_age: float = field(
        default=_DAY,
        metadata=field_meta(
            "Seconds a queued event may wait before it is dropped (counted, logged); keep the "
            "stream's duplicate window at least this long.",
            min=1,
        ),
    )
    type: Literal["nats"] = "nats"


_SCHEMES = ("nats://", "tls://")
_BAD_TOKEN = re.compile(r"[\s*>]")
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


def _check(path: str, s: NatsSinkSettings) -> None:
    if not s.servers:
        raise ConfigError(f"{path}.servers: name at least one server, e.g. nats://nats.example:4222")
    for i, url in enumerate(s.servers):
        remember_url_credentials(url)
        if not url.startswith(_SCHEMES):
            raise ConfigError(f"{path}.servers[{i}]: not a nats:// or tls:// URL")
    tokens = s.subject_prefix.split(".")
    if any(not t or _BAD_TOKEN.search(t) for t in tokens):
        raise ConfigError(
            f"{path}.subject_prefix: dot-separated tokens without spaces or wildcards (* >), e.g. "
            "pod-resources or fleet.eu-1"
        )
    if not _STREAM_NAME.fullmatch(s.stream):
        raise ConfigError(f"{path}.stream: letters, digits, _ and - only (a JetStream stream name)")
    methods = [
        name
        for name, on in (
            ("token", s.token is not None),
            ("user/password", s.user is not None or s.password is not None),
            ("nkey_seed", s.nkey_seed is not None),
            ("creds_file", s.creds_file is not None),
        )
        if on
    ]
    if len(methods) > 1:
        raise ConfigError(f"{path}: one way to authenticate, not {' and '.join(methods)}")
    if (s.user is None) != (s.password is None):
        raise ConfigError(f"{path}.user: user and password go together")
    if s.nkey_seed is not None and not _is_user_seed(s.nkey_seed.get().strip()):
        raise ConfigError(f"{path}.nkey_seed: not an NKey user seed (those start with SU)")
    check_client_files(path, s, extra=("creds_file",))
    if s.create_stream and s.duplicate_window < s.max_age:
        raise ConfigError(
            f"{path}.duplicate_window: {s.duplicate_window:g} s is shorter than max_age "
            f"({s.max_age:g} s): an event re-published after that long would be stored twice; "
            "raise duplicate_window or lower max_age"
        )


def _is_user_seed(seed: str) -> bool:
    """Whether `seed` decodes as an NKey user seed: one that is not (a typo, a truncated paste)
    would make every connect raise instead of failing here, naming the key."""
    import nkeys  # type: ignore[import-untyped]  # nats-py's own dependency for NKeys, untyped

    try:
        prefix, key = nkeys.decode_seed(bytearray(seed.encode()))
    except (nkeys.NkeysError, ValueError):
        return False
    return bool(prefix == nkeys.PREFIX_BYTE_USER and len(key) == 32)


_DNS_TOKEN = re.compile(r"[a-z0-9-]+(?:\.[a-z0-9-]+)*")


def node_token(node: str) -> str:
    """The node as one subject token: a DNS name (every Kubernetes node's) with its dots as `_`,
    which no DNS name has, so two nodes never share a token; any other name is cut to safe
    characters and told apart by a digest of it."""
    if _DNS_TOKEN.fullmatch(node) and len(node) <= 253:
        return node.replace(".", "_")
    safe = re.sub(r"[^A-Za-z0-9-]", "-", node)[:64]
    digest = hashlib.sha256(node.encode(errors="backslashreplace")).hexdigest()[:12]
    return f"{safe}-{digest}"


def subject_for(prefix: str, event: Event) -> str:
    last = "send-test" if _is_test(event) else str(event.kind)
    return f"{prefix}.{node_token(event.node)}.{last}"


_HEADER_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _is_test(event: Event) -> bool:
    return event.details.get("test") is True


def message_headers(event: Event) -> dict[str, str]:
    headers = {
        "Nats-Msg-Id": event.id,
        "Prw-Schema": SCHEMA_VERSION,
        "Prw-Seq": str(event.seq),
        # The node name is the operator's, but a header line must stay one line whatever it is.
        "Prw-Node": _HEADER_UNSAFE.sub("?", event.node),
        # A consumer routing on this header must not take send-test's device.removed for one.
        "Prw-Kind": "send-test" if _is_test(event) else str(event.kind),
    }
    if _is_test(event):
        headers["Prw-Test"] = "true"
    return headers


def wire_size(headers: dict[str, str], payload: bytes) -> int:
    """What the server counts against its max_payload: the header block as the client writes it
    (`NATS/1.0`, one `Key: value` line each, a blank line) and the payload."""
    block = len(b"NATS/1.0\r\n\r\n") + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return block + len(payload)


class StreamError(Exception):
    """The stream is missing (and not ours to create) or does not take our subjects."""


@dataclass(frozen=True)
class Published:
    """How a publish of a batch went: the first `done` events are stored (acknowledged);
    `duplicates` of them the server already had; `error` stopped the rest (`oversized`: the event
    after the stored ones can never be published as it is)."""

    done: int
    duplicates: int = 0
    error: str = ""
    oversized: bool = False
    # The JetStream context should be made afresh: a publish raised after the client had taken a
    # slot for it (never given back), or no stream answered (deleted? check it again).
    stale: bool = False


_RETRYABLE_HINT = "the cluster may be electing a stream leader or unreachable; retried"


class Publisher:
    """Publishes events in order with up to `max_in_flight` acknowledgements outstanding.

    Separate from the connection (the sink owns one; a load generator shares a few among many
    simulated nodes), so what is measured is what the agent runs.
    """

    def __init__(
        self,
        js: nats.js.client.JetStreamContext,
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
            run.fail(
                redact(f"the stream refused it: {err.description} (code {err.err_code})"),
                oversized=err.err_code == _MAX_MSG_SIZE,
            )
        except (nats.errors.Error, OSError) as err:
            run.fail(redact(f"{type(err).__name__}: {err}"))
        else:
            run.stored(bool(ack.duplicate))


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


# JetStream's error code for a message over the stream's max_msg_size.
_MAX_MSG_SIZE = 10054


class ConnectionLog:
    """One sink's connection story across its clients: whether an outage was already logged (one
    line per outage, not one per reconnect attempt or per failed first connect), and what the
    server said asynchronously that explains a later timeout (a permissions violation is sent as
    an error line, and the request it refused just never gets an answer)."""

    def __init__(self) -> None:
        self.last = ""
        self.down = False
        self.attempts = 0


def _client(*, tls: bool) -> nats.aio.client.Client:
    """A client; with `tls`, one that connects with TLS or not at all. nats-py upgrades to TLS only
    when the server's INFO asks for it, so a server without TLS (or anyone in between rewriting its
    INFO) would be sent the credentials in the clear, tls:// URL and ca_file notwithstanding. Asking
    for the upgrade ourselves makes the handshake fail there instead, before CONNECT is sent."""
    from nats.aio.client import Client

    if not tls:
        return Client()

    class TlsOnlyClient(Client):
        async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
            info["tls_required"] = True
            await super()._process_info(info, initial_connection)

    return TlsOnlyClient()


def _connect_error(errors: Sequence[Exception], err: BaseException) -> BaseException:
    """Why a first connect failed, where nats-py says only "no servers available" (`err`): a
    refused credential if an attempt was refused (the server closes at once, so another attempt may
    end in a reset instead), else the last attempt's error (a certificate that does not verify...)."""
    import nats.errors

    if any("authorization violation" in str(e).lower() for e in errors):
        return nats.errors.AuthorizationError()
    last = errors[-1]
    return last if isinstance(last, (nats.errors.Error, OSError, TimeoutError)) else err


async def connect(
    settings: NatsSinkSettings, *, name: str, notes: ConnectionLog | None = None
) -> nats.aio.client.Client:
    """A connected client that reconnects on its own for good; raises on the first connect's failure."""
    import nats.errors

    s = settings
    options: dict[str, Any] = {}
    if s.ca_file is not None or s.cert_file is not None or any(u.startswith("tls://") for u in s.servers):
        options["tls"] = client_context(s.ca_file, s.cert_file, s.key_file)
    # Secrets are read at each (re)connect, so a rotated file is used from the next one.
    if s.token is not None:
        token = s.token
        options["token"] = lambda: token.get()
    if s.user is not None and s.password is not None:
        password = s.password
        options["user"] = s.user
        options["password"] = lambda: password.get()
    if s.nkey_seed is not None:
        options["nkeys_seed_str"] = s.nkey_seed.get().strip()
    if s.creds_file is not None:
        options["user_credentials"] = str(s.creds_file)

    state = notes if notes is not None else ConnectionLog()
    closing = False
    failures: deque[Exception] = deque(maxlen=8)  # the latest, to say why a first connect failed

    async def on_error(err: Exception) -> None:
        text = redact(f"{type(err).__name__}: {err}")
        if "permissions violation" in text.lower():
            # Not an outage: the connection stays up, and the refused request times out.
            if state.last != text:
                state.last = text
                log.error(
                    "the NATS server refused a request of this agent's user: grant it (README, NATS: "
                    "least privilege)",
                    sink=settings.name,
                    error=text,
                )
            return
        failures.append(err)
        state.attempts += 1
        if not state.down and not closing:
            state.down = True
            log.warning(
                "NATS connection error; the client keeps reconnecting on its own (logged once per outage)",
                sink=settings.name,
                error=text,
            )

    async def on_disconnected() -> None:
        # Our own close (drain) disconnects too: nothing to report then.
        if not state.down and not closing and not (nc.is_draining or nc.is_closed):
            state.down = True
            log.warning("disconnected from NATS; reconnecting on its own", sink=settings.name)

    async def on_reconnected() -> None:
        url = nc.connected_url
        log.info(
            "reconnected to NATS",
            sink=settings.name,
            server=redact_url(url.geturl()) if url else None,
            failed_attempts=state.attempts,
        )
        state.down, state.attempts = False, 0

    nc = _client(tls="tls" in options)
    try:
        async with asyncio.timeout(s.timeout * max(1, len(s.servers)) + 1):
            await nc.connect(
                servers=list(s.servers),
                name=name,
                connect_timeout=max(1, round(s.timeout)),
                allow_reconnect=True,
                # The first connect tries each server twice and fails (the worker retries it);
                # once connected, the client reconnects for good.
                max_reconnect_attempts=1,
                reconnect_time_wait=1,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **options,
            )
    except BaseException as err:
        closing = True
        with contextlib.suppress(Exception):
            await nc.close()
        if failures and isinstance(err, (nats.errors.NoServersError, TimeoutError)):
            why = _connect_error(failures, err)
            if why is not err:
                raise why from err
        raise
    nc.options["max_reconnect_attempts"] = -1
    if state.down:
        log.info("connected to NATS", sink=settings.name, failed_attempts=state.attempts)
    state.down, state.attempts = False, 0
    return nc


def _takes(pattern: str, subject: str) -> bool:
    """Whether a stream subject (with * and > wildcards) matches `subject`."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


async def ensure_stream(js: nats.js.client.JetStreamContext, settings: NatsSinkSettings, node: str) -> None:
    """The stream exists (created when `create_stream`) and takes this node's subjects; raises
    StreamError saying what to do otherwise. A duplicate window shorter than `max_age` is logged."""
    import nats.js.errors
    from nats.js.api import StorageType, StreamConfig

    s = settings
    probe = f"{s.subject_prefix}.{node_token(node)}.device.removed"
    try:
        info = await js.stream_info(s.stream)
    except nats.js.errors.NotFoundError:
        if not s.create_stream:
            raise StreamError(
                f"stream {s.stream} does not exist: create it (subjects {s.subject_prefix}.>, a duplicate "
                f"window of at least {s.max_age:g} s; README, NATS JetStream) or set create_stream = true"
            ) from None
        info = await js.add_stream(
            StreamConfig(
                name=s.stream,
                subjects=[f"{s.subject_prefix}.>"],
                storage=StorageType.FILE,
                num_replicas=s.stream_replicas,
                duplicate_window=s.duplicate_window,
                max_age=s.stream_max_age or None,
            )
        )
        log.info(
            "created the stream",
            sink=s.name,
            stream=s.stream,
            replicas=s.stream_replicas,
            duplicate_window_s=s.duplicate_window,
        )
    # A replicated stream answers publishes only once its replicas elect a leader (just created,
    # or mid-election): wait for that, bounded, rather than fail a delivery with "no responders".
    loop = asyncio.get_running_loop()
    deadline = loop.time() + s.timeout
    while info.cluster is not None and not info.cluster.leader and loop.time() < deadline:
        await asyncio.sleep(0.05)
        info = await js.stream_info(s.stream)
    subjects = info.config.subjects or []
    if not any(_takes(p, probe) for p in subjects):
        raise StreamError(
            f"stream {s.stream} does not take {s.subject_prefix}.> (its subjects: {', '.join(subjects)}); "
            "add the subjects to it or set subject_prefix"
        )
    window = info.config.duplicate_window or 0.0
    if window < s.max_age:
        log.warning(
            "the stream's duplicate window is shorter than max_age: an event re-published after that "
            "long (a long outage, then a lost acknowledgement) would be stored twice",
            sink=s.name,
            stream=s.stream,
            duplicate_window_s=window,
            max_age_s=s.max_age,
        )


async def publisher_for(nc: nats.aio.client.Client, settings: NatsSinkSettings, node: str) -> Publisher:
    """A fresh JetStream context on `nc` with the stream checked (`ensure_stream`), and its Publisher."""
    s = settings
    # The client's own bound on publishes awaiting acknowledgement is ours: never more.
    js = nc.jetstream(timeout=s.timeout, publish_async_max_pending=s.max_in_flight)
    await ensure_stream(js, s, node)
    return Publisher(
        js,
        stream=s.stream,
        prefix=s.subject_prefix,
        timeout=s.timeout,
        max_in_flight=s.max_in_flight,
        max_payload=nc.max_payload,
    )


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
                self._publisher = None  # a fresh context, and the stream checked again, next time
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
        nc, self._nc, self._publisher = self._nc, None, None
        if nc is None:
            return
        try:
            async with asyncio.timeout(self.settings.timeout):
                await nc.drain()
        except Exception:  # the servers are gone: close without flushing
            pass
        if not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.close()


def _nats_sink(settings: NatsSinkSettings, context: SinkContext) -> NatsSink:
    return NatsSink(settings, node=context.node)


register(
    SinkType(
        name="nats",
        settings=NatsSinkSettings,
        factory=_nats_sink,
        validate=_check,
        capabilities=Capabilities(batches=True),
        order=90,
    )
)
