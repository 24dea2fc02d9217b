"""What the fleet section returns: a row of figures for each phase, fleet start, capacity row and
the leader kill, and the whole of them."""

from __future__ import annotations

from dataclasses import dataclass

from bench.fleet.plan import FleetPlan

__all__ = [
    "Arrivals",
    "Capacity",
    "Failover",
    "FleetResult",
    "FleetRun",
    "Phase",
    "ScriptKinds",
    "Started",
    "StreamCheck",
    "Window",
]


@dataclass(frozen=True)
class StreamCheck:
    """The stream read back whole: what it holds, ids sent but absent, ids stored twice, a node's
    seq going backwards; a few ids of each."""

    stored: int
    lost: int
    duplicated: int
    out_of_order: int
    examples: dict[str, list[str]]  # "lost", "duplicated"


@dataclass(frozen=True)
class Arrivals:
    """A phase's events at the consumer: events/s over `span_s`, each one's latency."""

    events: int
    received: int
    per_s: float
    span_s: float
    latency: tuple[float, ...]


@dataclass(frozen=True)
class Phase:
    """A fleet's steady state or its burst, through one sink."""

    sink: str
    nodes: int
    connections: int
    retries: int
    abandoned: int
    stored: int
    lost: int
    duplicated: int
    out_of_order: int | None  # the webhook's receiver does not say
    events: int
    received: int
    per_s: float
    span_s: float
    latency: tuple[float, ...]
    lag_max: int | None  # the consumer's; no consumer behind a webhook
    lag_end: int | None
    burst_nodes: int = 0  # the nodes that lost a GPU (the burst)
    open_s: float | None = None  # the webhook's sinks made beforehand in


@dataclass(frozen=True)
class FleetRun:
    steady: Phase
    burst: Phase


@dataclass(frozen=True)
class Started:
    """A fleet's nodes started as agents start, before the clock: the wall time, this process's RSS."""

    nodes: int
    connections: int
    shared: bool
    start_s: float
    rss_mib: float


@dataclass(frozen=True)
class Window:
    """What a capacity window counted, and the CPU (in cores) of the generators and the servers."""

    seconds: float
    events: int
    per_s: float
    generator_cores: float
    server_cores: float | None  # the webhook's receiver runs in the generator's process


@dataclass(frozen=True)
class Capacity:
    """A sustained-capacity row: its median run, with every run's events/s in `runs`."""

    sink: str
    nodes: int
    connections: int
    processes: int
    max_in_flight: int
    batch: int
    seconds: float
    events: int
    per_s: float
    generator_cores: float
    server_cores: float | None
    made_late: int | None  # events made while the clock ran (None: not known)
    runs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Failover:
    """The run during which the stream's leader was killed; `killed` None: no kill."""

    nodes: int
    connections: int
    shared: bool
    rate: float
    seconds: float
    events: int
    killed: str | None
    new_leader: str | None
    kill_at_s: float | None
    down_s: float | None
    rejoin_s: float | None
    max_stall: float
    ack_gap: float  # the longest time in which nothing at all was acknowledged
    latency: tuple[float, ...]
    received: int
    deliveries: int
    lag_max: int
    lag_end: int | None
    retries: int
    abandoned: int
    errors: dict[str, int]  # why retries failed, the most common first
    stored: int
    lost: int
    duplicated: int
    out_of_order: int
    examples: dict[str, list[str]]


@dataclass(frozen=True)
class ScriptKinds:
    """The scripted events' kinds: each steady step's, and the burst's (with its severity)."""

    steady: tuple[tuple[str, ...], ...]
    burst: tuple[str, ...]
    mean_events: float


@dataclass(frozen=True)
class FleetResult:
    plan: FleetPlan
    script: ScriptKinds
    fleets: tuple[FleetRun, ...]  # by fleet size
    connect: tuple[Started, ...]  # by fleet size
    capacity: tuple[Capacity, ...]  # the nats rows, then the webhook's
    failover: Failover
    webhook: FleetRun
    profiles: dict[str, list[str]]  # of the goals not met, by label
