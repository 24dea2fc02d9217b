"""A replayed churn script against the script's own truth, per sink class.

Restarts that warm up, a plugin restart, a hot-plug of 64 devices that then fail at once and come
back, a flapping GPU, an id that is not UTF-8 and a pod allocation. The audit log (and webhooks)
must carry every real device and allocation change and nothing else; paging sinks (PagerDuty,
Alertmanager, whose route this test applies) must open exactly one condition per real problem.
Precision and recall are both 1.0 for both classes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from testkit.agent import make_settings, running_agent
from testkit.fake_kubelets import StartKubelet
from watcher.model.changes import Severity
from watcher.model.conditions import condition_of
from watcher.model.events import Event
from watcher.model.routing import Route
from watcher.sim.fake_node import FakeDevice
from watcher.sim.fake_plugins import Warmup

GPU = "nvidia.com/gpu"
FPGA = "example.com/fpga"
AUDITED = ("device.added", "device.removed", "allocation.added", "allocation.removed", "allocation.changed")
# PagerDuty's and Alertmanager's route: warnings and above, resolutions, flapping and incident
# members left out (they get device.flapping and device.incident instead).
PAGING = Route(
    min_severity=Severity.WARNING, resolutions=True, skip_flapping=True, skip_incident_devices=True
)


def _audit_key(e: Event) -> tuple[str, ...]:
    d = e.details
    if str(e.kind).startswith("device."):
        return (str(e.kind), d["resource"], d["device"])
    return (str(e.kind), f"{d['namespace']}/{d['pod']}/{d['container']}")


def _score(seen: Counter[tuple[str, ...]], truth: Counter[tuple[str, ...]]) -> tuple[float, float]:
    hit = sum((seen & truth).values())
    precision = hit / sum(seen.values()) if seen else 1.0
    recall = hit / sum(truth.values()) if truth else 1.0
    return precision, recall


async def test_churn_precision_and_recall_are_one_for_every_sink_class(
    short_tmp: Path, start_kubelet: StartKubelet
) -> None:
    settings = make_settings(short_tmp)
    settings = dataclasses.replace(
        settings, watch=dataclasses.replace(settings.watch, flap_limit=4, flap_window=60, flap_quiet=1.0)
    )
    truth: Counter[tuple[str, ...]] = Counter()
    problems: set[str] = set()
    fake = await start_kubelet(seed=21)
    async with running_agent(settings, fake) as run:
        await run.recorder.kinds_after(0, 1)
        await run.settled()
        mark = len(run.recorder.events)
        fake.plugins.warmup = Warmup(plugin_delay=(0.1, 0.6), pods_delay=(0.0, 0.3))

        # 1. A kubelet restart that changes nothing, and a plugin restart: no real change.
        await fake.restart(downtime=0.1)
        await run.recorder.until(lambda: "kubelet.restarted" in run.recorder.kinds(mark))
        await run.settled()
        fake.plugins.restart_plugin(GPU, downtime=0.3)
        await run.recorder.until(lambda: "plugin.registered" in run.recorder.kinds(mark))
        await run.settled()

        # 2. 64 FPGAs hot-plugged; then they all fail at once (one incident); then all come back.
        fpgas = [f"FPGA-{i:02d}" for i in range(64)]
        for dev in fpgas:
            fake.node.add_device(FakeDevice(FPGA, dev, (0,)))  # one checkpoint rewrite for all
        fake.write_state_files()
        truth.update(("device.added", FPGA, d) for d in fpgas)
        await run.recorder.until(lambda: run.recorder.kinds(mark).count("device.added") >= 64)
        for dev in fpgas:
            fake.node.devices[(FPGA, dev)].healthy = False
        fake.write_state_files()
        truth.update(("device.removed", FPGA, d) for d in fpgas)
        await run.recorder.until(lambda: "device.incident" in run.recorder.kinds(mark))
        incident = next(e for e in run.recorder.events[mark:] if e.kind == "device.incident")
        problems.add(f"{incident.node}/incident/{incident.details['incident']}")
        for dev in fpgas:
            fake.node.devices[(FPGA, dev)].healthy = True
        fake.write_state_files()
        truth.update(("device.added", FPGA, d) for d in fpgas)
        await run.recorder.until(lambda: "device.incident_resolved" in run.recorder.kinds(mark))

        # 3. A GPU flapping ten times: one problem for a person.
        gpu = sorted(i for r, i in fake.node.devices if r == GPU)[0]
        for i in range(10):
            fake.set_healthy(GPU, gpu, healthy=i % 2 == 1)
            truth[("device.removed" if i % 2 == 0 else "device.added", GPU, gpu)] += 1
            await run.quiet_cycle()
        problems.add(f"node-a/device/{GPU}/{gpu}")
        await run.recorder.until(lambda: "device.flap_ended" in run.recorder.kinds(mark), timeout=10)

        # 4. A device id that is not UTF-8, and a pod allocating a GPU.
        fake.faults.substitute(b"GPU-evil", b"GPU\xffevil")
        fake.add_device(GPU, "GPU-evil", (1,))
        truth[("device.added", GPU, "GPU\\xffevil")] += 1
        free = sorted(i for r, i in fake.node.devices if r == GPU and i != gpu)[-1]
        fake.allocate("churn", "job-1", "main", devices={GPU: [free]})
        truth[("allocation.added", "churn/job-1/main")] += 1
        await run.recorder.until(lambda: "allocation.added" in run.recorder.kinds(mark))
        await run.quiet_cycle()

        events = run.recorder.events[mark:]
        audit = Counter(_audit_key(e) for e in events if e.kind in AUDITED)
        assert _score(audit, truth) == (1.0, 1.0), (audit - truth, truth - audit)
        opened = {
            c.key for e in events if PAGING.matches(e) and (c := condition_of(e)) is not None and c.active
        }
        assert _score(Counter(opened), Counter(problems)) == (1.0, 1.0), (opened, problems)
        assert "kubelet.unreachable" not in run.recorder.kinds(mark)
