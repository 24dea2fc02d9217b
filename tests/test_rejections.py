"""Pods the node rejects at admission for a device reason (watcher.model.rejections): which
failures count, each pod told once (a resync, a restart, the first look), and many in a window one
incident that opens once and ends once the window passes quiet."""

from __future__ import annotations

from watcher.model.changes import Kind, Severity
from watcher.model.conditions import condition_of
from watcher.model.devicehealth.affected import owner_text
from watcher.model.devicehealth.pods import Owner, PodMeta
from watcher.model.events import envelope
from watcher.model.rejections import FORGET_AFTER, Rejections, rejection_of, window_text

GPU = "nvidia.com/gpu"
# The real kubelet's words (kubelet.go rejectPod, cm/admission/errors.go, cm/devicemanager/manager.go).
UNHEALTHY = (
    "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy "
    f"devices {GPU}, which is unexpected"
)
UNAVAILABLE = (
    "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
    f"{GPU}. Requested: 1, Available: 0, which is unexpected"
)
JOB = Owner("Job", "llm-pretrain", "job-uid")


def _pod(
    name: str, reason: str = "UnexpectedAdmissionError", message: str = UNHEALTHY, **kw: object
) -> PodMeta:
    return PodMeta(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        phase="Failed",
        reason=reason,
        message=message,
        **kw,  # type: ignore[arg-type]
    )


def test_the_device_managers_failures_count_and_name_their_resource() -> None:
    for message in (
        UNHEALTHY,
        UNAVAILABLE,
        f"Pod was rejected: Allocate failed due to cannot allocate unregistered device {GPU}, which is "
        "unexpected",
    ):
        found = rejection_of(_pod("a", message=message))
        assert found is not None and found.resource == GPU, message
        assert not found.message.startswith("Pod was rejected: ")
    out_of = rejection_of(
        _pod(
            "b",
            f"OutOf{GPU}",
            f"Pod was rejected: Node didn't have enough resource: {GPU}, requested: 1, used: 0, capacity: 0",
        )
    )
    assert out_of is not None and out_of.resource == GPU and out_of.reason == f"OutOf{GPU}"


def test_failures_that_are_not_about_devices_never_count() -> None:
    cpu = (
        "Pod was rejected: Allocate failed due to not enough cpus available to satisfy request: "
        "requested=4, available=2, which is unexpected"
    )
    for reason, message in [
        ("UnexpectedAdmissionError", cpu),
        (
            "OutOfcpu",
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 0, capacity: 2",
        ),
        ("OutOfmemory", "Pod was rejected: Node didn't have enough resource: memory"),
        ("OutOfpods", "Pod was rejected: Node didn't have enough resource: pods"),
        ("NodeAffinity", "Pod was rejected: Predicate NodeAffinity failed"),
        ("TopologyAffinityError", "Pod was rejected: Resources cannot be allocated with Topology locality"),
        ("Evicted", "The node was low on resource: memory."),
    ]:
        assert rejection_of(_pod("x", reason, message)) is None, reason
    running = PodMeta(
        uid="u",
        namespace="ml",
        name="r",
        phase="Running",
        reason="UnexpectedAdmissionError",
        message=UNHEALTHY,
    )
    assert rejection_of(running) is None


def test_one_rejection_is_one_warning_naming_pod_owner_resource_and_the_kubelets_words() -> None:
    state, out = Rejections().observe(0.0, [], threshold=3, window=300)
    assert out == [] and state.baseline
    pod = _pod("worker-0", owner=JOB)
    state, out = state.observe(1.0, [pod], threshold=3, window=300)
    (told,) = out
    assert told.kind is Kind.POD_REJECTED and told.severity is Severity.WARNING
    # The sinks put the owner first (owner_text): the summary itself does not repeat it.
    assert owner_text(told.details) == "Job ml/llm-pretrain"
    assert told.summary.startswith("pod ml/worker-0 rejected at admission for nvidia.com/gpu")
    assert "no healthy devices present" in told.summary
    assert told.details["pod_uid"] == "uid-worker-0" and told.details["owner"]["name"] == "llm-pretrain"
    assert told.details["resource"] == GPU and told.details["reason"] == "UnexpectedAdmissionError"
    # The same pod again (a resync, a MODIFIED event, the next cycle): nothing new.
    state, out = state.observe(2.0, [pod], threshold=3, window=300)
    assert out == []
    # No page from one rejection, and nothing to end.
    assert state.open == () and state.next_look(300) is None
    assert condition_of(envelope(told, seq=1, node="n1", cycle="c", before=None, after=None)) is None


def test_pods_rejected_before_the_first_look_are_old_news() -> None:
    old = [_pod(f"old-{i}") for i in range(5)]
    state, out = Rejections().observe(0.0, old, threshold=3, window=300)
    assert out == [] and state.open == ()
    state, out = state.observe(1.0, [*old, _pod("new")], threshold=3, window=300)
    assert [c.details["pod"] for c in out] == ["new"]


def test_twelve_in_the_window_are_one_incident_paged_once_and_ended_after_a_quiet_window() -> None:
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    pods: list[PodMeta] = []
    kinds: list[Kind] = []
    for i in range(12):
        pods.append(_pod(f"w-{i}", owner=JOB))
        state, out = state.observe(10.0 * i, pods, threshold=3, window=300)
        kinds += [c.kind for c in out]
    assert kinds.count(Kind.POD_REJECTED) == 12 and kinds.count(Kind.NODE_REJECTING_PODS) == 1
    assert kinds.index(Kind.NODE_REJECTING_PODS) == 3  # after the third rejection, not before
    assert state.next_look(300) == 110.0 + 300
    state, out = state.observe(409.0, pods, threshold=3, window=300)
    assert out == []
    state, out = state.observe(410.0, pods, threshold=3, window=300)
    (ended,) = out
    assert ended.kind is Kind.NODE_REJECTING_PODS_ENDED and ended.details["count"] == 12
    assert state.open == ()


def test_the_incident_reads_as_a_person_asks_and_pages_on_one_key() -> None:
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    burst = [_pod(f"w-{i}", owner=JOB) for i in range(12)]
    state, out = state.observe(5.0, burst, threshold=3, window=300)
    (opened,) = [c for c in out if c.kind is Kind.NODE_REJECTING_PODS]
    assert opened.severity is Severity.CRITICAL
    assert owner_text(opened.details) == "Job ml/llm-pretrain"
    assert opened.summary.startswith("node keeps rejecting nvidia.com/gpu pods: 12 in 5 min")
    page = condition_of(envelope(opened, seq=1, node="n1", cycle="c", before=None, after=None))
    state, out = state.observe(305.0, burst, threshold=3, window=300)
    resolve = condition_of(envelope(out[0], seq=2, node="n1", cycle="c", before=None, after=None))
    assert page is not None and resolve is not None
    assert page.key == resolve.key == "n1/rejecting/nvidia.com/gpu" and page.active and not resolve.active


def test_rejections_spread_wider_than_the_window_never_page() -> None:
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    pods: list[PodMeta] = []
    for i in range(6):
        pods.append(_pod(f"slow-{i}"))
        state, out = state.observe(200.0 * i, pods, threshold=3, window=300)
        assert [c.kind for c in out] == [Kind.POD_REJECTED]


def test_a_restart_neither_tells_again_nor_loses_the_open_incident() -> None:
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    pods = [_pod(f"w-{i}") for i in range(3)]
    state, out = state.observe(100.0, pods, threshold=3, window=300)
    assert Kind.NODE_REJECTING_PODS in [c.kind for c in out]
    saved = state.to_json(now=150.0)
    # A new process: its monotonic clock starts elsewhere.
    back = Rejections.from_json(saved, now=7.0)
    back, out = back.observe(8.0, pods, threshold=3, window=300)
    assert out == []
    back, out = back.observe(7.0 + 250.0, pods, threshold=3, window=300)
    assert [c.kind for c in out] == [Kind.NODE_REJECTING_PODS_ENDED]
    # Unreadable state: a fresh first look, which takes what is there as old news.
    fresh = Rejections.from_json({"format": 1, "told": 3}, now=0.0)
    assert fresh == Rejections()
    _, out = fresh.observe(0.0, pods, threshold=3, window=300)
    assert out == []


def test_pods_a_restarted_kubelet_shows_again_are_not_told_again_and_uids_are_forgotten_later() -> None:
    """A restarted kubelet's Pods API is live before it has read its failed pods back from the API
    server: they vanish from the view, then come back. Not news; a uid gone an hour is forgotten."""
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    pods = [_pod(f"w-{i}") for i in range(5)]
    state, out = state.observe(1.0, pods, threshold=3, window=300)
    assert len(out) == 6  # five told, one incident
    state, out = state.observe(2.0, [], threshold=3, window=300)  # the warm-up's empty view
    assert out == [] and state.told == {p.uid for p in pods}
    state = Rejections.from_json(state.to_json(now=3.0), now=3.0)  # and the agent restarts meanwhile
    state, out = state.observe(4.0, pods, threshold=3, window=300)
    assert out == []
    state, _ = state.observe(5.0, pods[1:], threshold=3, window=300)
    state, _ = state.observe(5.0 + FORGET_AFTER, pods[1:], threshold=3, window=300)
    assert "uid-w-0" not in state.told and "uid-w-1" in state.told


def test_rejections_while_the_kubelet_warms_up_are_told_but_page_nobody() -> None:
    """Pods a restarted kubelet refuses before its device plugins registered again are the
    warm-up's: each is told, none counts toward an incident."""
    state, _ = Rejections().observe(0.0, [], threshold=3, window=300)
    pods = [_pod(f"w-{i}") for i in range(5)]
    state, out = state.observe(1.0, pods, threshold=3, window=300, holding=True)
    assert [c.kind for c in out] == [Kind.POD_REJECTED] * 5 and state.open == ()
    state, out = state.observe(2.0, [*pods, _pod("after")], threshold=3, window=300)
    assert [c.kind for c in out] == [Kind.POD_REJECTED]  # the warm-up's five never count


def test_the_window_reads_in_minutes_when_whole() -> None:
    assert window_text(300) == "5 min" and window_text(90) == "90 s" and window_text(20) == "20 s"
