"""A fleet into NATS JetStream, beside the same load through the webhook sink into one receiver
(`bench/run.py --only fleet`; BENCHMARKS.md, section 10).

Many simulated nodes play the event streams a real fleet's agents would send, through the sinks'
own delivery code, into a real 3-node JetStream cluster on loopback (`testkit/nats_cluster.py`:
three `nats-server` processes, a stream with 3 replicas on file storage, created by the sink's own
`ensure_stream` with its defaults):

- Events are the agent's own. Each simulated node walks a script of re-query results made by the
  agent's model: real inventories of the simulated kubelet's node (`watcher.sim`) diffed by
  `watcher.model.diff`, so each step yields exactly the changes the agent would report (a GPU or
  a NIC allocated to a pod and freed, a free GPU failing and healing: each a device or allocation
  event plus the resource's capacity.changed), wrapped by `envelope` with the node's name and one
  increasing `seq` per node. The burst: a share of the nodes each lose a GPU that a pod holds, at
  the same instant (device.removed, critical, and capacity.changed).
- Rate: about 10 events/s per 1,000 nodes at steady state (a node changes every ~200 s), as
  Poisson arrivals of re-queries over the whole fleet, then the burst.
- Delivery as the agent's worker does it: each node has its own queue, and its own nats sink:
  a whole `NatsSink` (its `deliver`: its own connection, the stream checked, the nats sink's
  `Publisher` with `max_in_flight` 1 and the publish timeout at their defaults, a fresh JetStream
  context after a failed publish, nothing published while reconnecting); or a `WebhookSink`
  (`deliver`, batch on; see below). Everything queued, up to the sink's default `max_batch`, goes
  in one delivery; what is not `done` is sent again after the worker's backoff (full jitter from
  0.5 s, doubling), until it is (bounded: events still unsent after `give_up_s` count as lost).
  The delivery worker's rate limit and the outbox are not in the loop: what is measured is the
  sink's publishing and the cluster. Each node starts as an agent does, before the clock: its
  first delivery (watcher.started) connects its sink, checks the stream and publishes.
- Connections: a real fleet has one connection per node, and so has each simulated node here
  when the fleet is no larger than `max_connections` (10,000 in the full run: starting them takes
  seconds and a few hundred MiB of this process, measured and reported); beyond that, nodes share
  connections round-robin, each with its own JetStream context and `Publisher` made as the sink
  makes them (`SharedPublisher`), and the report says how many connections there were. The
  sustained-capacity rows say theirs. What is set up before the clock starts is frozen out of the
  garbage collector's sight (`gc.freeze`): a full collection rescanning 10,000 clients would stop
  this process for most of a second, which no agent (one connection) ever does.
- The reader: a durable pull consumer (each message acknowledged as it arrives) in this same
  process, on a connection of its own, with pull requests kept topped up, records when each event
  id first arrives. Publish to consumer: from the moment the node's worker first handed the event
  to its sink's delivery to its arrival there, on the same monotonic clock.
  Consumer lag: the stream's last sequence minus the consumer's acknowledgement floor, sampled
  every 250 ms; the maximum of each phase and the value once everything was read.
- Sustained capacity: simulated nodes deliver full `max_batch` batches back to back; after a
  warm-up, what the stream holds (stream info, i.e. what the cluster stored) is counted over a
  fixed window. The nodes' events are made before the clock starts (enough for STOCK_RATE
  events/s; a node that runs out makes more as it goes, and the report counts them): an agent
  builds its events in its own cycle on its own node, and one process building envelopes for
  hundreds of simulated nodes would time the simulation, not the sink. A Python process uses
  one core at most, and one generator process tops out near the goal by itself, so a row may
  split its nodes and connections over generator processes (`python -m bench.fleet flood`);
  the CPU of the generators and of the three servers (utime + stime, /proc) over the window
  shows where the two cores went. Each row is a lower bound of what the
  cluster takes; the goal is judged on the best row at the sink's defaults (max_in_flight 1).
  When it is not met, that row is run again briefly in this process under cProfile and the top
  entries are reported (likewise the latency run, if its goal is not met).
- Leader kill: during a run (1,000 nodes, 50x the realistic rate, so many publishes are in
  flight), the stream's leader is killed with SIGKILL and restarted on its store later. Every
  node retries until its events are stored; then the whole stream is read back: lost (ids sent
  but absent), duplicated (ids stored twice), and out of order (a node's seq going backwards in
  stream order). The longest publish stall: from an event's first attempt to its acknowledgement
  (the worker's backoff included); and the longest time in which nothing at all was acknowledged.
- Webhook side by side: the same 1,000-node load and burst through `WebhookSink.deliver` (`batch`
  on, the webhook's best case) into ONE aiohttp receiver on loopback (bench/receiver.py) in this
  process, and its capacity the same way. The nodes share 100 sinks (each an aiohttp session with
  up to 4 connections), made before the clock starts: a session's first use builds its TLS context
  (tens of ms of CPU, even for http://), which an agent pays once when it starts, and a thousand
  of them would cost this process half a minute.

Everything shares this machine's cores: the three servers, the generator and the reader. The
figures are therefore a floor for a cluster on machines of its own, and the split of CPU is shown.
"""

from __future__ import annotations

from bench.fleet.plan import FULL, QUICK, CapacityRow, FleetPlan
from bench.fleet.run import bench_fleet, median_run
from bench.fleet.script import Script, script

__all__ = ["FULL", "QUICK", "CapacityRow", "FleetPlan", "Script", "bench_fleet", "median_run", "script"]
