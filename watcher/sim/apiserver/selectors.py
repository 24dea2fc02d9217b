"""List selectors as the real server parses them: a fieldSelector over the fields it lets one
select per kind, and equality-based labelSelectors."""

from __future__ import annotations

import re
from collections.abc import Callable

from watcher.sim.apiserver.errors import bad_request
from watcher.sim.apiserver.kinds import Kind
from watcher.sim.apiserver.values import Json, dig

__all__ = ["field_selector", "label_selector"]

# The fields a list's fieldSelector may name, per kind and view (the real server's selectable
# fields, with events.k8s.io's names converted to the stored ones); anything else is a 400.
_EVENT_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "reason": ("reason",),
    "type": ("type",),
    "reportingComponent": ("reportingController",),
    **{
        f"involvedObject.{f}": ("regarding", f)
        for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    },
}
_SOURCE = ("deprecatedSource", "component")
_SELECTABLE: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("", "events"): {**_EVENT_FIELDS, "source": _SOURCE},
    ("events.k8s.io", "events"): {
        **{k: v for k, v in _EVENT_FIELDS.items() if not k.startswith(("involvedObject.", "reporting"))},
        "reportingController": ("reportingController",),
        **{f"regarding.{p[1]}": p for k, p in _EVENT_FIELDS.items() if k.startswith("involvedObject.")},
    },
    ("", "pods"): {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
        "spec.nodeName": ("spec", "nodeName"),
        "status.phase": ("status", "phase"),
    },
    ("", "nodes"): {"metadata.name": ("metadata", "name"), "spec.unschedulable": ("spec", "unschedulable")},
    ("", "namespaces"): {"metadata.name": ("metadata", "name"), "status.phase": ("status", "phase")},
    ("resource.k8s.io", "resourceslices"): {
        "metadata.name": ("metadata", "name"),
        "spec.nodeName": ("spec", "nodeName"),
        "spec.driver": ("spec", "driver"),
    },
    ("resource.k8s.io", "devicetaintrules"): {"metadata.name": ("metadata", "name")},
    ("coordination.k8s.io", "leases"): {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
    },
}


def field_selector(kind: Kind, text: str) -> Callable[[Json], bool]:
    """A fieldSelector (`a=b,c!=d`, `==` too) over the fields the real server lets one select, for
    the object as stored (an Event in its events.k8s.io form, whichever view was asked)."""
    fields = _SELECTABLE.get((kind.group, kind.resource), {})
    terms: list[tuple[tuple[str, ...], bool, str]] = []
    for term in filter(None, text.split(",")):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if m is None:
            raise bad_request(f'invalid field selector: "{term}"')
        label, op, value = m.groups()
        if label not in fields:
            raise bad_request(f"field label not supported: {label}")
        terms.append((fields[label], op == "!=", value))

    def match(obj: Json) -> bool:
        for path, negate, value in terms:
            found = dig(obj, path)
            if path == _SOURCE and not found:  # the server's fallback for events without a source
                found = obj.get("reportingController")
            text = "" if found is None else (str(found).lower() if isinstance(found, bool) else str(found))
            if (text == value) == negate:
                return False
        return True

    return match


def label_selector(text: str) -> Callable[[Json], bool]:
    """Equality-based label selectors only (`a=b,c!=d`); set-based ones are refused."""
    terms: list[tuple[str, bool, str]] = []
    for term in filter(None, text.split(",")):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if m is None:
            raise bad_request(f"set-based label selectors are not served by the fake API server: {term}")
        terms.append((m.group(1), m.group(2) == "!=", m.group(3)))

    def match(obj: Json) -> bool:
        labels = dig(obj, ("metadata", "labels")) or {}
        return all((labels.get(k) == v) != negate for k, negate, v in terms)

    return match
