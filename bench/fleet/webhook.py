"""The same load and its capacity through `WebhookSink.deliver` into one aiohttp receiver on loopback."""

from __future__ import annotations

import time

from bench.fleet.capacity import Flood, capacity_window, make_stocks, stock_per_node
from bench.fleet.connections import setup_frozen, sink_send
from bench.fleet.nodes import Fleet, Ledger, SimNode
from bench.fleet.phases import node_names
from bench.fleet.plan import CapacityRow, FleetPlan
from bench.fleet.reader import phase_row
from bench.fleet.results import Arrivals, Capacity, FleetRun, Phase
from bench.fleet.script import Script
from bench.receiver import Receiver
from watcher.secrets import Secret
from watcher.sinks.webhook import WebhookSink, WebhookSinkSettings

__all__ = ["hook_settings", "open_sinks", "webhook_capacity", "webhook_fleet"]


def hook_settings(port: int) -> WebhookSinkSettings:
    return WebhookSinkSettings(name="hook", url=Secret(value=f"http://127.0.0.1:{port}/"), batch=True)


def open_sinks(settings: WebhookSinkSettings, count: int) -> list[WebhookSink]:
    """`count` webhook sinks with their HTTP sessions made: a session's first use builds its TLS
    context (the system's CA bundle, tens of ms of CPU, even for http://), which an agent pays
    once when it starts, not in a delivery."""
    sinks = [WebhookSink(settings, node=f"gpu-node-{i:05d}") for i in range(count)]
    for sink in sinks:
        sink.http.session()
    return sinks


async def webhook_fleet(plan: FleetPlan, play: Script) -> FleetRun:
    receiver = Receiver()
    server = await receiver.server().start()
    ledger = Ledger()
    ledger.received = receiver.ids
    settings = hook_settings(server.port)
    t = time.monotonic()
    sinks = open_sinks(settings, min(plan.webhook_nodes, plan.webhook_sinks))
    open_s = time.monotonic() - t
    try:
        fleet = Fleet(plan, play, ledger, max_batch=settings.max_batch, seed=plan.webhook_nodes)
        for i in range(plan.webhook_nodes):
            fleet.add(f"gpu-node-{i:05d}", sink_send(sinks[i % len(sinks)]))
        with setup_frozen():
            t0 = time.monotonic()
            steady = await fleet.play(plan.per_node_rate * plan.webhook_nodes, plan.steady_s)
            await fleet.settle()
            t1 = time.monotonic()
            burst = fleet.burst(plan.burst_share)
            await fleet.settle()
    finally:
        for sink in sinks:
            await sink.close()
        await server.close()
    sent = [*steady, *burst]

    def phase(arrivals: Arrivals, burst_nodes: int = 0) -> Phase:
        return Phase(
            sink="webhook",
            nodes=plan.webhook_nodes,
            connections=len(sinks),
            open_s=open_s,
            retries=ledger.retries,
            abandoned=ledger.abandoned,
            stored=receiver.count,
            lost=sum(1 for i in sent if i not in receiver.ids),
            duplicated=receiver.receipts - receiver.count,
            out_of_order=None,
            lag_max=None,
            lag_end=None,
            **vars(arrivals),
            burst_nodes=burst_nodes,
        )

    return FleetRun(
        steady=phase(phase_row(steady, ledger, plan.steady_s, t0)),
        burst=phase(phase_row(burst, ledger, None, t1), burst_nodes=len(burst) // len(play.burst.changes)),
    )


async def webhook_capacity(play: Script, row: CapacityRow, window: tuple[float, float]) -> Capacity:
    receiver = Receiver()
    server = await receiver.server().start()
    settings = hook_settings(server.port)
    sinks = open_sinks(settings, row.connections)

    async def stored() -> int:
        return receiver.receipts

    try:
        nodes = [
            SimNode(name, sink_send(sinks[i % len(sinks)]), i)
            for i, name in enumerate(node_names(0, row.nodes))
        ]
        stock = stock_per_node(row.nodes, sum(window), settings.max_batch)
        flood = Flood(nodes, play, settings.max_batch, make_stocks(nodes, play, stock))
        try:
            with setup_frozen():
                measured = await capacity_window(window, stored, time.process_time, ())
        finally:
            await flood.stop()
    finally:
        for sink in sinks:
            await sink.close()
        await server.close()
    # The receiver is in this process: its CPU is in the generator's figure.
    return Capacity(
        sink="webhook",
        nodes=row.nodes,
        connections=len(sinks),
        processes=1,
        max_in_flight=1,
        batch=settings.max_batch,
        **vars(measured),
        made_late=flood.made_late,
    )
