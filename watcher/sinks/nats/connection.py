"""The connection to NATS: a client that reconnects on its own for good, authenticated as the
settings say, TLS-only where they ask for TLS, and one log line per outage, not one per attempt."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from watcher.secrets import redact, redact_url
from watcher.sinks.nats.settings import NatsSinkSettings
from watcher.tls import client_context

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.aio.client

__all__ = ["ConnectionLog", "abort_socket", "connect"]

log = structlog.get_logger("watcher.sinks.nats")


class ConnectionLog:
    """One sink's connection story across its clients: whether an outage was already logged (one
    line per outage, not one per reconnect attempt or per failed first connect, and only while the
    connection is really down), and what the server said asynchronously that explains a later
    timeout (a permissions violation is sent as an error line, and the request it refused just
    never gets an answer)."""

    def __init__(self) -> None:
        self.last = ""
        self.reported = ""  # the last client error seen while connected, logged once
        self.down = False
        self.attempts = 0


def abort_socket(nc: nats.aio.client.Client) -> None:
    """Abort the client's socket: what it still holds unsent is dropped, and whatever waits for
    a peer that reads nothing (a close, a flush) ends at once."""
    transport = getattr(getattr(getattr(nc, "_transport", None), "_io_writer", None), "transport", None)
    if transport is not None:
        transport.abort()


def _client(*, tls: bool) -> nats.aio.client.Client:
    """A client whose handshake fails as one failed attempt whatever the peer sends; with `tls`,
    one that connects with TLS or not at all. nats-py upgrades to TLS only when the server's INFO
    asks for it, so a server without TLS (or anyone in between rewriting its INFO) would be sent the
    credentials in the clear, tls:// URL and ca_file notwithstanding. Asking for the upgrade
    ourselves makes the handshake fail there instead, before CONNECT is sent."""
    import nats.errors
    from nats.aio.client import Client

    class AgentClient(Client):
        async def _process_connect_init(self) -> None:
            try:
                await super()._process_connect_init()
            except (nats.errors.Error, OSError, TimeoutError):
                raise
            except (ValueError, LookupError, TypeError, AttributeError) as err:
                # A greeting no NATS server sends (an INFO line over the client's read buffer, one
                # that is no JSON object) escapes nats-py as itself: a traceback on every retry of
                # a first connect, and the end of the reconnect loop (a blind agent) on a later one.
                # Its socket is cut here: a failed reconnect attempt would leave it open.
                abort_socket(self)
                raise nats.errors.Error(
                    f"nats: the server's greeting is not one a NATS server sends ({type(err).__name__}: "
                    f"{str(err)[:200]})"
                ) from err

    if not tls:
        return AgentClient()

    class TlsOnlyClient(AgentClient):
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


def _options(s: NatsSinkSettings) -> dict[str, Any]:
    """The client's TLS and auth options, as the settings say."""
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
    return options


class _Callbacks:
    """The client's error, disconnect and reconnect callbacks: one log line per outage, and the
    first connect's failed attempts kept to say why it failed."""

    def __init__(self, sink: str, state: ConnectionLog, nc: nats.aio.client.Client) -> None:
        self.sink = sink
        self.state = state
        self.nc = nc
        self.closing = False
        self.failures: deque[Exception] = deque(maxlen=8)  # the latest, to say why a first connect failed

    async def on_error(self, err: Exception) -> None:
        import nats.errors

        state = self.state
        text = redact(f"{type(err).__name__}: {err}")
        if "permissions violation" in text.lower():
            # Not an outage: the connection stays up, and the refused request times out.
            if state.last != text:
                state.last = text
                log.error(
                    "the NATS server refused a request of this agent's user: grant it (docs/nats.md: "
                    "least privilege)",
                    sink=self.sink,
                    error=text,
                )
            return
        # The client reports a lost connection (EOF, a socket error, a stale ping) while its status
        # still says connected, before it starts reconnecting: that is an outage whatever the status.
        lost = isinstance(err, OSError | nats.errors.UnexpectedEOF | nats.errors.StaleConnectionError)
        if self.nc.is_connected and not lost:
            # Not an outage either (an exception in a callback, a slow consumer): saying the
            # connection failed would be false, and would leave the next real outage unlogged.
            if state.reported != text:
                state.reported = text
                log.error(
                    "the NATS client reported an error; the connection is up", sink=self.sink, error=text
                )
            return
        self.failures.append(err)
        state.attempts += 1
        if not state.down and not self.closing:
            state.down = True
            log.warning(
                "NATS connection error; the client keeps reconnecting on its own (logged once per outage)",
                sink=self.sink,
                error=text,
            )

    async def on_disconnected(self) -> None:
        nc = self.nc
        # Our own close (drain) disconnects too: nothing to report then.
        if not self.state.down and not self.closing and not (nc.is_draining or nc.is_closed):
            self.state.down = True
            log.warning("disconnected from NATS; reconnecting on its own", sink=self.sink)

    async def on_reconnected(self) -> None:
        url = self.nc.connected_url
        log.info(
            "reconnected to NATS",
            sink=self.sink,
            server=redact_url(url.geturl()) if url else None,
            failed_attempts=self.state.attempts,
        )
        self.state.down, self.state.attempts = False, 0


async def connect(
    settings: NatsSinkSettings, *, name: str, notes: ConnectionLog | None = None
) -> nats.aio.client.Client:
    """A connected client that reconnects on its own for good; raises on the first connect's failure."""
    import nats.errors

    s = settings
    options = _options(s)
    state = notes if notes is not None else ConnectionLog()
    nc = _client(tls="tls" in options)
    calls = _Callbacks(settings.name, state, nc)
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
                error_cb=calls.on_error,
                disconnected_cb=calls.on_disconnected,
                reconnected_cb=calls.on_reconnected,
                **options,
            )
    except BaseException as err:
        calls.closing = True
        with contextlib.suppress(Exception):
            await nc.close()
        if calls.failures and isinstance(err, (nats.errors.NoServersError, TimeoutError)):
            why = _connect_error(calls.failures, err)
            if why is not err:
                raise why from err
        raise
    nc.options["max_reconnect_attempts"] = -1
    if state.down:
        log.info("connected to NATS", sink=settings.name, failed_attempts=state.attempts)
    state.down, state.attempts = False, 0
    return nc
