"""Settling: what the kubelet's warm-up explains is held back until the node has settled.

After a restart the kubelet answers with every resource's devices missing until that resource's
device plugin registers again, and `List` fills in as its pod sources sync; a device plugin
that restarts on its own takes all its resource's devices away until it is back. None of that
is a change on the node, and none of it may reach a person. So:

- After a kubelet restart every resource that had devices is held, and so are the pods `List`
  does not show yet. A resource is released when its devices are back (its plugin registered:
  a plugin hands over its whole device list at once); the pods when every resource is released
  and the pod list has stopped changing; anything still held after `grace` is released as it is.
- Without a restart, a resource whose devices ALL vanished at once while a device plugin's socket
  went away is held the same way (`plugin.unregistered`, then `plugin.registered` when back).
  A device that vanishes while the plugins stay registered is not held: it is reported at once.
- While something is held, the agent reports the "presented" inventory: the answer, with the
  held resources' devices and the held pods taken from the last settled inventory. When a hold
  ends, the next diff is the net change between the settled inventory and the answer.

Pure: the caller brings the time, the answers and the plugin sockets it saw.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from watcher.model.changes import Change, Kind, Severity
from watcher.model.inventory import Inventory

__all__ = ["DEPARTURE_S", "PODS_STABLE_S", "POLL_S", "Settling"]

POLL_S = 1.0  # while something is held, look again this often (2 RPCs: well inside our 5/s cap)
PODS_STABLE_S = 2.0  # the pod list must not change for this long before held pods are released
# The kubelet drops a departed plugin's devices when the plugin's ListAndWatch stream ends, which
# can be a moment after its socket is gone. A look in between sees the socket gone and every device
# still there; for this long after, those devices leaving is still that plugin's departure.
DEPARTURE_S = 5.0


def _resources(inv: Inventory) -> frozenset[str]:
    return frozenset(d.resource for d in inv.devices)


@dataclass(frozen=True)
class Settling:
    held: tuple[tuple[str, float], ...] = ()  # (resource, monotonic time its hold began), sorted
    kubelet_restart: bool = False  # the holds come from a kubelet restart (no plugin events)
    pods_since: float | None = None  # pods are held since (a kubelet restart), else None
    pod_keys: frozenset[tuple[str, str]] = frozenset()  # the pods of the last answer
    pods_changed_at: float = 0.0  # when the pod list last changed
    sockets: frozenset[str] | None = None  # the plugin sockets of the last settled look
    # Each plugin socket seen gone and since when, while it stays away (see DEPARTURE_S), sorted.
    departed: tuple[tuple[str, float], ...] = ()
    last_look: float = 0.0
    # False from a kubelet restart's detection until the first answer after it: the restart may be
    # seen on a look the kubelet refused (rate-limited by another client, failing, too large), and
    # the hold must then last from the first answer, not from the refusal.
    restart_answered: bool = True

    @property
    def holding(self) -> bool:
        return bool(self.held) or self.pods_since is not None

    def held_resources(self) -> frozenset[str]:
        return frozenset(r for r, _ in self.held)

    def began(self) -> float | None:
        """When the oldest hold began; None when nothing is held."""
        starts = [since for _, since in self.held]
        if self.pods_since is not None:
            starts.append(self.pods_since)
        return min(starts, default=None)

    def next_look(self, grace: float) -> float | None:
        """When to look again while something is held (stability, or a grace running out). None
        until the first answer after a restart: until then the kubelet's own refusal says when
        (its retry or rate-limit backoff), and looks of ours would only add to it."""
        began = self.began()
        if began is None or not self.restart_answered:
            return None
        return min(self.last_look + POLL_S, began + grace)

    def kubelet_restarted(self, now: float, settled: Inventory) -> Settling:
        """Hold every resource that had devices, and the pods, until the node settles again. Called
        when the restart is seen, whether or not that look was answered: the hold's grace then
        counts from the first answer after it."""
        held = tuple((r, now) for r in sorted(_resources(settled)))
        return dataclasses.replace(
            self,
            held=held,
            kubelet_restart=True,
            pods_since=now,
            pods_changed_at=now,
            restart_answered=False,
            last_look=now,
        )

    def observe(
        self,
        now: float,
        settled: Inventory,
        answer: Inventory,
        sockets: frozenset[str] | None,
        grace: float,
    ) -> tuple[Settling, list[Change]]:
        """Take one answer into account: new plugin departures are held, resources whose devices
        are back (or whose grace ran out) are released. Returns the plugin lifecycle changes."""
        changes: list[Change] = []
        state = self
        if not state.restart_answered:
            # The first answer since the restart: the warm-up is seen from here.
            state = dataclasses.replace(
                state,
                held=tuple((r, now) for r, _ in state.held),
                pods_since=now if state.pods_since is not None else None,
                pods_changed_at=now,
                restart_answered=True,
            )
        if state.pods_since is not None:  # the pod list is watched only while pods are held
            keys = frozenset((p.namespace, p.name) for p in answer.pods)
            if keys != state.pod_keys:
                state = dataclasses.replace(state, pod_keys=keys, pods_changed_at=now)
        held = dict(state.held)
        present = _resources(answer) if answer.allocatable_known else None
        departed = state._departures(now, sockets)
        # A plugin's departure: its resource's devices all gone while a plugin socket went away.
        if present is not None and sockets is not None and not state.kubelet_restart:
            gone = sorted(_resources(settled) - present - held.keys())
            if gone and state._socket_went_away(sockets, settled, departed, now):
                for resource in gone:
                    held[resource] = now
                    changes.append(_plugin_change(Kind.PLUGIN_UNREGISTERED, resource, settled, grace))
        for resource, since in list(held.items()):
            back = present is None or resource in present
            if back or now - since >= grace:
                del held[resource]
                if back and not state.kubelet_restart:
                    changes.append(
                        _plugin_change(Kind.PLUGIN_REGISTERED, resource, answer, grace, since=since, now=now)
                    )
        pods_since = state.pods_since
        if pods_since is not None and (
            now - pods_since >= grace or (not held and now - state.pods_changed_at >= PODS_STABLE_S)
        ):
            pods_since = None
        kubelet_restart = state.kubelet_restart and bool(held or pods_since is not None)
        settled_sockets = state.sockets
        if not held and pods_since is None and sockets is not None:
            settled_sockets = sockets
        # A departure is forgotten once its window has passed and the settled set no longer has
        # the socket (kept while held, so the next look does not time it afresh).
        kept = {n: t for n, t in departed.items() if now - t < DEPARTURE_S or n in (settled_sockets or ())}
        after = dataclasses.replace(
            state,
            held=tuple(sorted(held.items())),
            kubelet_restart=kubelet_restart,
            pods_since=pods_since,
            sockets=settled_sockets,
            departed=tuple(sorted(kept.items())),
            last_look=now,
        )
        return after, changes

    def _departures(self, now: float, sockets: frozenset[str] | None) -> dict[str, float]:
        """Each plugin socket seen gone, timed from its own departure (another plugin's going
        neither resets nor ends it); a socket back is no longer departed."""
        departed = dict(self.departed)
        if sockets is None:
            return departed
        departed = {n: t for n, t in departed.items() if n not in sockets}
        for name in (self.sockets or frozenset()) - sockets:
            departed.setdefault(name, now)
        return departed

    def _socket_went_away(
        self, sockets: frozenset[str], settled: Inventory, departed: dict[str, float], now: float
    ) -> bool:
        if self.sockets is not None:
            # Within DEPARTURE_S of a socket going: the kubelet drops the devices only when the
            # plugin's stream ends, which can be a look or two after the socket is gone.
            return any(now - since < DEPARTURE_S for since in departed.values())
        # First look since the agent started: fewer plugin sockets than resources means some
        # plugin is not registered (one socket per resource is the common layout).
        return len(sockets) < len(_resources(settled))

    def present(self, settled: Inventory, answer: Inventory) -> Inventory:
        """The answer with what is held taken from the settled inventory."""
        held = self.held_resources()
        if not held and self.pods_since is None:
            return answer
        devices = answer.devices
        if held and answer.allocatable_known and settled.allocatable_known:
            kept = [d for d in answer.devices if d.resource not in held]
            kept.extend(d for d in settled.devices if d.resource in held)
            devices = tuple(sorted(kept, key=lambda d: (d.resource, d.id)))
        pods = answer.pods
        if self.pods_since is not None:
            shown = {(p.namespace, p.name) for p in answer.pods}
            missing = [p for p in settled.pods if (p.namespace, p.name) not in shown]
            if missing:
                pods = tuple(sorted([*answer.pods, *missing], key=lambda p: (p.namespace, p.name)))
        if devices is answer.devices and pods is answer.pods:
            return answer
        presented = dataclasses.replace(answer, devices=devices, pods=pods)
        # The same content as the settled inventory is the same inventory: no change to report.
        return settled if presented.content_hash == settled.content_hash else presented


def _plugin_change(
    kind: Kind,
    resource: str,
    inv: Inventory,
    grace: float,
    *,
    since: float | None = None,
    now: float | None = None,
) -> Change:
    devices = sorted(d.id for d in inv.devices if d.resource == resource)
    details: dict[str, object] = {"resource": resource, "devices": devices}
    if kind is Kind.PLUGIN_UNREGISTERED:
        summary = (
            f"{resource}: its device plugin went away; its {len(devices)} device(s) are not reported "
            f"missing unless the plugin stays away for {grace:g} s"
        )
        details["grace_s"] = grace
    else:
        away = (now or 0.0) - (since or 0.0)
        summary = (
            f"{resource}: its device plugin registered again after {away:.1f} s ({len(devices)} device(s))"
        )
        details["away_s"] = round(away, 3)
    return Change(kind, Severity.INFO, summary, details)
