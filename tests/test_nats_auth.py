"""The nats sink's authentication and TLS against real nats-server processes, and that no
credential ever shows: not in a delivery's error, a log line, or `check-config`'s output.

Each test starts one nats-server (tests/nats_cluster.py, one node) set up for one way to
authenticate: a token, users with passwords, an NKey user, operator mode (JWTs built here from
their public format and signed with NKeys made here) with a creds file, TLS with a CA and client
certificates (the `pki` fixture: the openssl command). What a delivery stored is read back from the
stream over the test's own connection: the message ids are the events' ids.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nkeys
import pytest
from nats.js.api import StreamConfig
from structlog.testing import capture_logs

from testkit.agent import make_settings, running_agent
from testkit.certificates import client_context
from testkit.fake_kubelets import StartKubelet
from testkit.nats_cluster import NatsCluster, NatsServer
from testkit.planted_secret import PLANTED_SECRET
from testkit.waiting import wait_until
from watcher.cli import main
from watcher.model.changes import Change, Kind, Severity
from watcher.model.events import Event, envelope
from watcher.settings_file import parse_settings
from watcher.sinks.base import Outcome
from watcher.sinks.nats import NatsSink, NatsSinkSettings

NODE = "node-a"
STREAM = "POD_RESOURCES"
PREFIX = "pod-resources"


def events(first: int, count: int = 1) -> list[Event]:
    out = []
    for seq in range(first, first + count):
        device = f"GPU-{seq}"
        change = Change(
            Kind.DEVICE_REMOVED,
            Severity.CRITICAL,
            f"nvidia.com/gpu {device} left allocatable (unhealthy or unplugged)",
            {"resource": "nvidia.com/gpu", "device": device},
        )
        out.append(envelope(change, seq=seq, node=NODE, cycle=f"cycle-{seq}", before=None, after=None))
    return out


def ids(batch: Iterable[Event]) -> list[str]:
    return [e.id for e in batch]


def nats_settings(servers: list[str], *, name: str = "nats", **table: Any) -> NatsSinkSettings:
    """A nats sink's settings as the config file gives them (parsed and checked like check-config)."""
    (cfg,) = parse_settings(
        {"sinks": {name: {"type": "nats", "servers": servers, "timeout": 2, **table}}}
    ).sinks
    assert isinstance(cfg, NatsSinkSettings)
    return cfg


def write_secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


@dataclass
class Server:
    """One running nats-server with the stream, the test's own way in (`admin`), and the sinks
    made against it (closed before the server stops)."""

    cluster: NatsCluster
    admin: dict[str, Any]
    sinks: list[NatsSink] = field(default_factory=list)

    @property
    def node(self) -> NatsServer:
        return self.cluster.servers[0]

    @property
    def url(self) -> str:
        return self.node.url

    def sink(self, servers: list[str] | None = None, **table: Any) -> NatsSink:
        sink = NatsSink(nats_settings(servers or [self.url], **table), node=NODE)
        self.sinks.append(sink)
        return sink

    async def connect(self) -> nats.NATS:
        async with asyncio.timeout(10):  # the helper's client retries for good
            return await self.cluster.connect(**self.admin)

    async def stored(self) -> list[str]:
        """The Nats-Msg-Id of each message in the stream, in stream order."""
        nc = await self.connect()
        try:
            js = nc.jetstream(timeout=5)
            state = (await js.stream_info(STREAM)).state
            if not state.messages:
                return []
            out = []
            for seq in range(state.first_seq, state.last_seq + 1):
                msg = await js.get_msg(STREAM, seq)
                assert msg.headers is not None
                out.append(msg.headers["Nats-Msg-Id"])
            return out
        finally:
            await nc.close()

    def log_count(self, text: str) -> int:
        return self.node.log.read_text().count(text)

    async def until_logged(self, text: str, count: int, timeout: float = 10.0) -> None:
        """Until the server's log holds `text` `count` times (bounded)."""
        await wait_until(lambda: self.log_count(text) >= count, timeout, interval=0.02)

    async def reload(self, old: str, new: str) -> None:
        """Replace `old` by `new` in the server's config and have it reload (SIGHUP), waiting until
        it did."""
        config = self.node.config
        config.write_text(config.read_text().replace(old, new))
        done = self.log_count("Reloaded server configuration")
        assert self.node.process is not None
        os.kill(self.node.process.pid, signal.SIGHUP)
        await self.until_logged("Reloaded server configuration", done + 1)


@asynccontextmanager
async def nats_server(root: Path, config: str, **admin: Any) -> AsyncIterator[Server]:
    """A JetStream nats-server with `config` lines added, and the stream in it."""
    cluster = NatsCluster(root, size=1, extra=config)
    server = Server(cluster, admin)
    try:
        cluster.start_server(server.node)
        await cluster.wait_healthy(server.node, timeout=10)
        nc = await server.connect()
        try:
            stream = StreamConfig(
                name=STREAM, subjects=[f"{PREFIX}.>"], num_replicas=1, duplicate_window=86400.0
            )
            await nc.jetstream(timeout=5).add_stream(stream)
        finally:
            await nc.close()
        yield server
    finally:
        for sink in server.sinks:
            await sink.close()
        cluster.close()


def assert_retried(outcome: Outcome, says: str) -> None:
    assert not outcome.delivered and outcome.retry, outcome
    assert says in outcome.error, outcome.error


async def refused(sink: NatsSink, batch: list[Event], says: str = "authorization failed") -> list[Outcome]:
    """Deliver `batch` until a refusal says `says`, at most 3 times as the worker would retry: the
    server closes a refused connection at once, so one attempt may end in a reset that lost the
    server's -ERR. Each one a retry; none delivered."""
    outcomes = []
    for _ in range(3):
        outcome = await sink.deliver(batch)
        outcomes.append(outcome)
        assert not outcome.delivered and outcome.retry, outcome
        if says in outcome.error:
            return outcomes
    raise AssertionError(f"no refusal said {says!r}: {outcomes}")


def assert_unseen(secrets: Iterable[str], *texts: object) -> None:
    """None of `secrets` in any of `texts` (strings, or log entries shown as JSON)."""
    shown = [t if isinstance(t, str) else json.dumps(t, default=str) for t in texts]
    for n, secret in enumerate(secrets):
        for i, text in enumerate(shown):
            assert secret not in text, f"secret #{n} showed in text #{i}"  # the text would show it again


async def can_connect(url: str, **auth: Any) -> bool:
    """Whether the server at `url` takes these credentials (one attempt, no reconnects)."""
    nc = nats.NATS()
    try:
        await nc.connect(servers=[url], allow_reconnect=False, connect_timeout=2, **auth)
    except nats.errors.Error:
        return False
    else:
        return True
    finally:
        await nc.close()  # a refused client keeps its socket open otherwise


# --- token --------------------------------------------------------------------------------------

TOKEN = "nats-token-0c1d2e3f4a5b"


def token_config(token: str) -> str:
    return f'authorization {{ token: "{token}" }}'


async def test_a_token_file_delivers_and_a_wrong_token_is_a_retry_saying_authorization_failed(
    short_tmp: Path,
) -> None:
    wrong = "nats-token-wrong-9f8e7d6c"
    token_file = short_tmp / "token"
    write_secret(token_file, wrong)
    batch = events(1, 2)
    async with nats_server(short_tmp / "nats", token_config(TOKEN), token=TOKEN) as server:
        sink = server.sink(token_file=str(token_file))
        with capture_logs() as logs:
            outcomes = await refused(sink, batch)
        assert_unseen([wrong, TOKEN], *(o.error for o in outcomes), logs)
        assert await server.stored() == []
        # Fixed in the file: the same sink's next delivery goes through.
        write_secret(token_file, TOKEN)
        assert (await sink.deliver(batch)).delivered
        assert await server.stored() == ids(batch)


async def test_a_rotated_token_file_is_used_at_the_next_connect_and_reconnect(short_tmp: Path) -> None:
    first, second, third = "nats-token-first-4d5e6f", "nats-token-second-7a8b9c", "nats-token-third-1b2c3d"
    token_file = short_tmp / "token"
    write_secret(token_file, first)
    e1, e2, e3 = events(1, 3)
    async with nats_server(short_tmp / "nats", token_config(first), token=first) as server:
        sink = server.sink(token_file=str(token_file))
        assert (await sink.deliver([e1])).delivered

        # The server reloads its config with a new token: it drops the connection made with the old
        # one, and the sink connects again with the token file as it is now.
        write_secret(token_file, second)
        await server.reload(first, second)
        server.admin = {"token": second}
        assert not await can_connect(server.url, token=first)
        # The first try may meet the dropped connection (a retry, as the worker would make it).
        first_try = await sink.deliver([e2])
        assert first_try.delivered or (await sink.deliver([e2])).delivered
        assert await server.stored() == ids([e1, e2])

        # Rotated again, and the server restarted with the new token: the client's own reconnect
        # (no new connection from the sink) reads the file again, since only the new token opens.
        # (The file is rotated first: nats-py leaves the socket of a refused reconnect unclosed.)
        write_secret(token_file, third)
        server.cluster.kill(server.node)
        server.node.config.write_text(server.node.config.read_text().replace(second, third))
        server.admin = {"token": third}
        with capture_logs() as logs:
            await server.cluster.restart(server.node, timeout=10)
            await wait_until(
                lambda: any(e["event"] == "reconnected to NATS" for e in logs), 10, interval=0.02
            )
            assert (await sink.deliver([e3])).delivered
        assert not await can_connect(server.url, token=second)
        assert await server.stored() == ids([e1, e2, e3])
        assert_unseen([first, second, third], logs)


# --- user and password --------------------------------------------------------------------------

PASSWORD = "nats-password-5e6f7a8b9c"


async def test_user_and_password_from_a_file_the_environment_or_the_url_deliver(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRW_NATS_PASSWORD", PASSWORD)
    wrong = "nats-password-wrong-0a0b0c"
    config = f'authorization {{ users: [ {{ user: prw, password: "{PASSWORD}" }} ] }}'
    batch = events(1, 3)
    async with nats_server(short_tmp / "nats", config, user="prw", password=PASSWORD) as server:
        from_file = server.sink(user="prw", password_file=write_secret(short_tmp / "password", PASSWORD))
        from_env = server.sink(user="prw", password="${PRW_NATS_PASSWORD}")
        in_url = server.sink([server.url.replace("nats://", f"nats://prw:{PASSWORD}@")])
        assert (await from_file.deliver(batch[:1])).delivered
        assert (await from_env.deliver(batch[1:2])).delivered
        assert (await in_url.deliver(batch[2:])).delivered
        assert await server.stored() == ids(batch)

        wrong_one = server.sink(user="prw", password_file=write_secret(short_tmp / "wrong", wrong))
        with capture_logs() as logs:
            outcomes = await refused(wrong_one, events(4))
        assert_unseen([wrong, PASSWORD], *(o.error for o in outcomes), logs)
        assert await server.stored() == ids(batch)


# --- NKey ---------------------------------------------------------------------------------------


def nkey_pair(prefix: int) -> tuple[str, nkeys.KeyPair]:
    """A new NKey: its seed (S + the role's letter: SU... for a user) and its key pair."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed.decode(), nkeys.from_seed(bytearray(seed))


def public(key: nkeys.KeyPair) -> str:
    return str(key.public_key.decode())


async def test_an_nkey_seed_file_delivers_and_an_unknown_nkey_is_refused(short_tmp: Path) -> None:
    seed, key = nkey_pair(nkeys.PREFIX_BYTE_USER)
    stranger, _ = nkey_pair(nkeys.PREFIX_BYTE_USER)
    assert seed.startswith("SU") and public(key).startswith("U")
    config = f"authorization {{ users: [ {{ nkey: {public(key)} }} ] }}"
    batch = events(1, 2)
    async with nats_server(short_tmp / "nats", config, nkeys_seed_str=seed) as server:
        sink = server.sink(nkey_seed_file=write_secret(short_tmp / "user.nk", seed))
        assert (await sink.deliver(batch)).delivered
        assert await server.stored() == ids(batch)

        other = server.sink(nkey_seed_file=write_secret(short_tmp / "stranger.nk", stranger))
        with capture_logs() as logs:
            outcomes = await refused(other, events(3))
        assert_unseen([seed, stranger], *(o.error for o in outcomes), logs)


# --- operator mode: JWTs and a creds file -------------------------------------------------------

_JWT_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_UNLIMITED = {"subs": -1, "data": -1, "payload": -1}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_jwt(issuer: nkeys.KeyPair, subject: str, name: str, claims: dict[str, Any]) -> str:
    """A NATS JWT (v2): header and claims as base64url JSON, signed by `issuer` with ed25519 over
    `header.claims`; its jti, as the NATS jwt library makes it, the base32 SHA-512/256 of the
    claims without it."""
    body: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**claims, "version": 2},
    }
    digest = hashlib.new("sha512_256", json.dumps(body).encode()).digest()  # the server does not recompute it
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    signing_input = f"{_b64url(json.dumps(_JWT_HEADER).encode())}.{_b64url(json.dumps(body).encode())}"
    return f"{signing_input}.{_b64url(issuer.sign(signing_input.encode()))}"


def creds_file(path: Path, account: nkeys.KeyPair, name: str) -> tuple[Path, str]:
    """A user of `account` as nsc writes it: the user's JWT (signed by the account) and seed."""
    seed, user = nkey_pair(nkeys.PREFIX_BYTE_USER)
    jwt = signed_jwt(account, public(user), name, {"type": "user", "pub": {}, "sub": {}, **_UNLIMITED})
    write_secret(
        path,
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n",
    )
    return path, seed


def operator_config(operator: nkeys.KeyPair, account: nkeys.KeyPair, system: nkeys.KeyPair) -> str:
    """A server trusting `operator`, with the JWTs of `account` (JetStream on) and of the system
    account (JetStream needs one) preloaded."""
    limits = {**_UNLIMITED, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    op_jwt = signed_jwt(operator, public(operator), "prw-operator", {"type": "operator"})
    account_jwt = signed_jwt(
        operator, public(account), "prw", {"type": "account", "limits": {**limits, **jetstream}}
    )
    system_jwt = signed_jwt(operator, public(system), "SYS", {"type": "account", "limits": limits})
    return (
        f'operator: "{op_jwt}"\nsystem_account: {public(system)}\nresolver: MEMORY\n'
        f'resolver_preload: {{\n  {public(account)}: "{account_jwt}"\n  {public(system)}: "{system_jwt}"\n}}'
    )


async def test_a_creds_file_delivers_to_a_server_in_operator_mode(short_tmp: Path) -> None:
    _, operator = nkey_pair(nkeys.PREFIX_BYTE_OPERATOR)
    _, account = nkey_pair(nkeys.PREFIX_BYTE_ACCOUNT)
    _, system = nkey_pair(nkeys.PREFIX_BYTE_ACCOUNT)
    # Never preloaded: the server knows nothing of this account or its users.
    _, unknown_account = nkey_pair(nkeys.PREFIX_BYTE_ACCOUNT)
    agent_creds, _ = creds_file(short_tmp / "agent.creds", account, "agent")
    admin_creds, _ = creds_file(short_tmp / "admin.creds", account, "admin")
    stranger_creds, stranger_seed = creds_file(short_tmp / "stranger.creds", unknown_account, "stranger")
    config = operator_config(operator, account, system)
    batch = events(1, 2)
    async with nats_server(short_tmp / "nats", config, user_credentials=str(admin_creds)) as server:
        sink = server.sink(creds_file=str(agent_creds))
        assert (await sink.deliver(batch)).delivered
        assert await server.stored() == ids(batch)

        other = server.sink(creds_file=str(stranger_creds))
        with capture_logs() as logs:
            outcomes = await refused(other, events(3))
        assert_unseen([stranger_seed], *(o.error for o in outcomes), logs)
        assert await server.stored() == ids(batch)


# --- TLS ----------------------------------------------------------------------------------------


def tls_config(pki: Path, *, verify: bool = False) -> str:
    lines = [f'cert_file: "{pki / "server.crt"}"', f'key_file: "{pki / "server.key"}"']
    if verify:  # mutual TLS: a client certificate from the CA, or no connection
        lines += [f'ca_file: "{pki / "ca.crt"}"', "verify: true"]
    return "tls {\n  " + "\n  ".join(lines) + "\n}"


async def test_tls_with_the_ca_file_delivers_and_an_unknown_ca_is_a_certificate_error(
    short_tmp: Path, pki: Path
) -> None:
    batch = events(1, 2)
    async with nats_server(short_tmp / "nats", tls_config(pki), tls=client_context(pki)) as server:
        tls_url = server.url.replace("nats://", "tls://")
        ca = str(pki / "ca.crt")
        assert (await server.sink(ca_file=ca).deliver(batch[:1])).delivered
        assert (await server.sink([tls_url], ca_file=ca).deliver(batch[1:])).delivered
        assert await server.stored() == ids(batch)

        untrusted = await asyncio.gather(
            server.sink([tls_url], timeout=1).deliver(events(3)),  # the system's CAs: not ours
            server.sink(ca_file=str(pki / "other-ca.crt"), timeout=1).deliver(events(3)),
        )
        for outcome in untrusted:
            assert_retried(outcome, "certificate verify failed")
        assert await server.stored() == ids(batch)


async def test_mutual_tls_delivers_with_a_client_certificate_from_the_ca_only(
    short_tmp: Path, pki: Path
) -> None:
    batch = events(1)
    config = tls_config(pki, verify=True)
    async with nats_server(short_tmp / "nats", config, tls=client_context(pki, "client")) as server:
        ca = str(pki / "ca.crt")
        mutual = server.sink(ca_file=ca, cert_file=str(pki / "client.crt"), key_file=str(pki / "client.key"))
        assert (await mutual.deliver(batch)).delivered
        assert await server.stored() == ids(batch)

        rogue = {"cert_file": str(pki / "rogue.crt"), "key_file": str(pki / "rogue.key")}
        without, with_rogue = await asyncio.gather(
            server.sink(ca_file=ca, timeout=1).deliver(events(2)),
            server.sink(ca_file=ca, timeout=1, **rogue).deliver(events(2)),
        )
        # The server refuses them after the client's side of the TLS 1.3 handshake is done: the
        # client sees its alert (certificate required, unknown ca) or the connection reset.
        for outcome in (without, with_rogue):
            assert_retried(outcome, "cannot reach NATS")
        assert await server.stored() == ids(batch)


async def test_tls_asked_for_is_required_so_credentials_never_cross_in_the_clear(
    short_tmp: Path, pki: Path
) -> None:
    """A tls:// URL or a ca_file asks for TLS; a server that offers none (or anyone in between who
    rewrites its INFO) must not be sent CONNECT with the credentials in it."""
    received: list[bytes] = []  # what each connection sent

    async def plaintext_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # What a nats-server without TLS says first (its INFO), then whatever the client sends.
        info = {"server_id": "NPLAIN", "version": "2.15.1", "proto": 1, "headers": True,
                "max_payload": 1048576, "auth_required": True, "jetstream": True}  # fmt: skip
        writer.write(b"INFO " + json.dumps(info).encode() + b"\r\n")
        await writer.drain()
        received.append(await reader.read(65536))
        writer.close()

    listener = await asyncio.start_server(plaintext_server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    tables: list[dict[str, Any]] = [
        {"servers": [f"tls://127.0.0.1:{port}"]},
        {"servers": [f"nats://127.0.0.1:{port}"], "ca_file": str(pki / "ca.crt")},
    ]
    sinks = [NatsSink(nats_settings(token=PLANTED_SECRET, timeout=1, **table), node=NODE) for table in tables]
    try:
        outcomes = await asyncio.gather(*(sink.deliver(events(1)) for sink in sinks))
    finally:
        for sink in sinks:
            await sink.close()
        listener.close()
        await listener.wait_closed()
    for outcome in outcomes:
        assert not outcome.delivered and outcome.retry, outcome
    assert received, "the clients never connected"
    for sent in received:
        assert b"CONNECT" not in sent and PLANTED_SECRET.encode() not in sent
        assert sent.startswith(b"\x16\x03")  # a TLS handshake record instead


# --- nothing shows: logs and check-config -------------------------------------------------------


async def test_the_agents_log_lines_on_an_auth_failure_hold_no_secret(
    short_tmp: Path, capfd: pytest.CaptureFixture[str], start_kubelet: StartKubelet
) -> None:
    url_password = "nats-url-password-3c4d5e"
    async with nats_server(short_tmp / "nats", token_config(TOKEN), token=TOKEN) as server:
        url_with_password = server.url.replace("nats://", f"nats://prw:{url_password}@")
        by_token = nats_settings([server.url], name="nats-token", token=PLANTED_SECRET)
        by_url = nats_settings([url_with_password], name="nats-url")
        settings = make_settings(short_tmp, http=False)
        settings = dataclasses.replace(settings, sinks=(*settings.sinks, by_token, by_url))
        fake = await start_kubelet(seed=1)
        with capture_logs() as logs:
            async with running_agent(settings, fake):
                # Each sink's delivery refused, as the worker logs it (retried: see `refused`).
                await wait_until(
                    lambda: (
                        {"nats-token", "nats-url"}
                        <= {
                            e.get("sink")
                            for e in logs
                            if e["event"] == "delivery failed; will retry"
                            and "authorization failed" in e["error"]
                        }
                    ),
                    15,
                )
    out, err = capfd.readouterr()
    assert_unseen([PLANTED_SECRET, url_password, f"prw:{url_password}"], out, err, *logs)


def test_check_config_shows_where_nats_secrets_come_from_never_what_they_are(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed, _ = nkey_pair(nkeys.PREFIX_BYTE_USER)
    secrets = {
        "token": PLANTED_SECRET,
        "password": "nats-inline-password-6d7e8f",
        "env password": "nats-env-password-9a0b1c",
        "nkey seed": seed,
        "url password": "nats-url-password-2d3e4f",
        "url token": "nats-url-token-5a6b7c8d",
    }
    monkeypatch.setenv("PRW_NATS_PASSWORD", secrets["env password"])
    config = tmp_path / "c.toml"
    config.write_text(
        f"""node = "n"
state_dir = "{tmp_path / "state"}"
[sinks.token]
type = "nats"
token = "{secrets["token"]}"
[sinks.password]
type = "nats"
user = "prw"
password = "{secrets["password"]}"
[sinks.env]
type = "nats"
user = "prw"
password = "${{PRW_NATS_PASSWORD}}"
[sinks.nkey]
type = "nats"
nkey_seed = "{secrets["nkey seed"]}"
[sinks.url]
type = "nats"
servers = ["nats://prw:{secrets["url password"]}@127.0.0.1:4222",
           "tls://{secrets["url token"]}@127.0.0.1:4223"]
"""
    )
    assert main(["check-config", str(config)]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    assert_unseen(secrets.values(), out)
    sinks = {sink["name"]: sink for sink in json.loads(out.split("\n", 1)[1])["sinks"]}
    assert sinks["token"]["token"] == "Secret(inline value)"
    assert sinks["password"]["password"] == "Secret(inline value)"
    assert sinks["env"]["password"] == "Secret(env PRW_NATS_PASSWORD)"
    assert sinks["nkey"]["nkey_seed"] == "Secret(inline value)"
    assert sinks["url"]["servers"] == ["nats://***@127.0.0.1:4222", "tls://***@127.0.0.1:4223"]


_SECRET_VALUE = "nats-refused-secret-8e9f0a"
_ACCOUNT_SEED = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_ACCOUNT).decode()
_CUT_USER_SEED = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER).decode()[:-4]  # a bad paste


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            f'token = "{_SECRET_VALUE}"\nuser = "prw"\npassword = "{_SECRET_VALUE}"',
            "sinks.n: one way to authenticate, not token and user/password",
        ),
        (f'nkey_seed = "{_ACCOUNT_SEED}"\ncreds_file = "c.creds"', "sinks.n: one way to authenticate"),
        ('user = "prw"', "sinks.n.user: user and password go together"),
        (f'password = "{_SECRET_VALUE}"', "sinks.n.user: user and password go together"),
        (f'nkey_seed = "{_ACCOUNT_SEED}"', "sinks.n.nkey_seed: not an NKey user seed"),
        (f'nkey_seed = "{_CUT_USER_SEED}"', "sinks.n.nkey_seed: not an NKey user seed"),
        ('nkey_seed = "SU-not-base32-at-all"', "sinks.n.nkey_seed: not an NKey user seed"),
        ('nkey_seed_file = "missing.nk"', "sinks.n.nkey_seed_file: cannot read secret file"),
        ('ca_file = "missing-ca.pem"', "sinks.n.ca_file: cannot read"),
        ('creds_file = "missing.creds"', "sinks.n.creds_file: cannot read"),
        ('cert_file = "client.pem"', "sinks.n.cert_file: cert_file and key_file go together"),
    ],
    ids=[
        "token-and-password",
        "nkey-and-creds",
        "user-without-password",
        "password-without-user",
        "account-seed",
        "cut-user-seed",
        "not-base32",
        "missing-seed-file",
        "missing-ca-file",
        "missing-creds-file",
        "cert-without-key",
    ],
)
def test_check_config_refuses_a_bad_nats_auth_naming_the_key(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], table: str, message: str
) -> None:
    (tmp_path / "c.creds").write_text("a creds file\n")
    config = tmp_path / "c.toml"
    config.write_text(f'node = "n"\nstate_dir = "{tmp_path / "state"}"\n[sinks.n]\ntype = "nats"\n{table}\n')
    assert main(["check-config", str(config)]) == 2
    out, err = capfd.readouterr()
    assert_unseen([_SECRET_VALUE, _ACCOUNT_SEED, _CUT_USER_SEED], err)
    assert out == ""
    assert err.startswith(f"pod-resources-watcher: error: {message}"), err
    assert err.count("\n") == 1
