"""The shipped ValidatingAdmissionPolicies, evaluated the way the Kubernetes API server does.

`admit(request)` runs every policy in deploy/kubernetes/reporting/admissionpolicy.yaml (with its
binding) against one write and returns None when all allow it, else the API server's denial message:
"ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE". `review(request)` returns the
`Denial` itself (message, reason, HTTP code) for a fake API server that must answer like the real one.

`request` is what admission sees of one write, as a dict:

    operation     "CREATE" | "UPDATE" | "DELETE" (a PATCH is an UPDATE)
    resource      "nodes", "pods", "events" (group and version inferred), or a dict
                  {"group", "version", "resource"}
    subResource   "status", or "" / absent
    name, namespace
    userInfo      {"username", "groups", "extra": {key: [values]}} (uid optional)
    object        the object as it would be stored (None for DELETE)
    oldObject     the stored object before (None for CREATE)

What the API server does, and this does too (k8s.io/apiserver, admission/plugin/policy/validating and
admission/plugin/cel): match the request against the policy's matchConstraints.resourceRules (and
excludeResourceRules); evaluate matchConditions (any false: the policy does not apply; an error with none
false: failurePolicy); then every validation, with `variables` evaluated lazily (a variable that fails
fails only the expressions that reach it); a validation that is false denies with its messageExpression's
result (trimmed; a non-string, a newline or an error falls back), else its message, else "failed
expression: ..."; one that errors denies under failurePolicy Fail and is ignored under Ignore. The first
denial wins, and only bindings with the Deny action deny. CEL bindings: object, oldObject, request (the
AdmissionRequest as the API server serializes it: empty fields left out), variables, params (null).
The request's empty fields are left out the same way, so an expression that reads one without has()
fails here as it would there.

What it does not do, and refuses rather than ignores: paramKind, namespaceSelector, objectSelector, a
binding's matchResources or paramRef, auditAnnotations. CEL is `common-expression-language` (Rust `cel`
crate: cel-go's heterogeneous equality, errors absorbed by && and || the same way), plus `join` from
the Kubernetes strings library; cost limits are not modelled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # the test extra's pyyaml, untyped

try:
    import cel
    from cel.stdlib import join
except ImportError as err:  # pragma: no cover - a missing test dependency
    raise ImportError(
        "testkit/admission_policy.py needs a CEL evaluator:"
        ' add "common-expression-language>=0.10" to the test extra'
    ) from err

__all__ = [
    "MAX_MESSAGE_BYTES",
    "POLICY_FILE",
    "REASON_CODES",
    "Denial",
    "Policy",
    "PolicyError",
    "admit",
    "load",
    "review",
]

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = ROOT / "deploy" / "kubernetes" / "reporting" / "admissionpolicy.yaml"

# Resource name -> (group, version, kind) for requests that name the resource by a plain string.
KNOWN_RESOURCES = {
    "nodes": ("", "v1", "Node"),
    "pods": ("", "v1", "Pod"),
    "events": ("events.k8s.io", "v1", "Event"),
}
# k8s.io/apiserver/pkg/apis/cel: MaxEvaluatedMessageExpressionSizeBytes.
MAX_MESSAGE_BYTES = 5 * 1024
# The HTTP status the API server answers a denial with, by its reason (metav1.StatusReason).
REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}

_POLICY_FIELDS = {"failurePolicy", "matchConstraints", "matchConditions", "variables", "validations"}
_CONSTRAINT_FIELDS = {"resourceRules", "excludeResourceRules", "matchPolicy"}
_BINDING_FIELDS = {"policyName", "validationActions"}
_RULE_FIELDS = {"operations", "apiGroups", "apiVersions", "resources", "resourceNames", "scope"}
_VARIABLE_REF = re.compile(r"\bvariables\.([A-Za-z_][A-Za-z0-9_]*)")


class PolicyError(ValueError):
    """A policy this evaluator cannot run faithfully, or that the API server would not accept."""


@dataclass(frozen=True)
class Denial:
    policy: str
    binding: str
    message: str
    reason: str = "Invalid"

    @property
    def code(self) -> int:
        return REASON_CODES.get(self.reason, 422)

    def __str__(self) -> str:
        where = f"ValidatingAdmissionPolicy '{self.policy}' with binding '{self.binding}'"
        return f"{where} denied request: {self.message}"


class _EvalError(Exception):
    pass


@dataclass(frozen=True)
class _Expression:
    source: str
    program: Any
    variables: frozenset[str]  # the `variables.NAME` it reads

    @classmethod
    def compile(cls, source: str, where: str) -> _Expression:
        try:
            program = cel.compile(source)
        except ValueError as err:  # the API server rejects a policy whose expression does not compile
            raise PolicyError(f"{where}: {source!r} does not compile: {err}") from err
        return cls(source, program, frozenset(_VARIABLE_REF.findall(source)))

    def run(self, bindings: dict[str, Any], variables: dict[str, Any], failed: dict[str, str]) -> Any:
        """The expression's value; _EvalError like the API server's "resulted in error". A variable that
        failed is absent from `variables`, so only an expression that actually reaches it fails."""
        context = cel.Context()
        for name, value in bindings.items():
            context.add_variable(name, value)
        context.add_variable("variables", variables)
        context.add_function("join", join)
        try:
            return self.program.execute(context)
        except Exception as err:  # the Rust extension raises several kinds; all are evaluation errors
            cause = "; ".join(failed[v] for v in sorted(self.variables & failed.keys())) or str(err)
            raise _EvalError(f"expression '{self.source}' resulted in error: {cause}") from err


def _rule_matches(rule: dict[str, Any], operation: str, gvr: dict[str, str], sub: str) -> bool:
    """k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules: operations, apiGroups,
    apiVersions, resources (with "*", "*/*", "r/*", "*/s"), scope."""
    unsupported = set(rule) - _RULE_FIELDS
    if unsupported:
        raise PolicyError(f"resource rule fields not implemented: {sorted(unsupported)}")
    if rule.get("scope", "*") != "*":
        raise PolicyError("resource rule scope other than * not implemented")

    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    if not (
        has(rule.get("operations", []), operation)
        and has(rule.get("apiGroups", []), gvr["group"])
        and has(rule.get("apiVersions", []), gvr["version"])
    ):
        return False
    names = rule.get("resourceNames") or []
    if names and gvr.get("name") not in names:
        return False
    for pattern in rule.get("resources", []):
        res, _, pattern_sub = pattern.partition("/")
        if pattern == "*/*":
            return True
        if pattern_sub == "":
            if sub == "" and res in ("*", gvr["resource"]):
                return True
        elif res in ("*", gvr["resource"]) and pattern_sub in ("*", sub) and sub != "":
            return True
    return False


def _admission_request(request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], str]:
    """The AdmissionRequest as the API server hands it to CEL (runtime.DefaultUnstructuredConverter of
    admissionv1.AdmissionRequest: fields tagged omitempty are left out when empty)."""
    resource = request["resource"]
    if isinstance(resource, str):
        group, version, kind = KNOWN_RESOURCES.get(resource, ("", "v1", ""))
        gvr = {"group": group, "version": version, "resource": resource}
    else:
        gvr = {k: resource[k] for k in ("group", "version", "resource")}
        kind = request.get("kind", "")
    gvk = {"group": gvr["group"], "version": gvr["version"], "kind": request.get("kind", kind)}
    sub = request.get("subResource") or ""
    user = request.get("userInfo") or {}
    user_info: dict[str, Any] = {}
    for key in ("username", "uid", "groups", "extra"):
        if user.get(key):
            user_info[key] = user[key]
    out: dict[str, Any] = {
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "operation": request["operation"],
        "userInfo": user_info,
        "dryRun": bool(request.get("dryRun", False)),
    }
    for key, value in (
        ("subResource", sub),
        ("requestSubResource", sub),
        ("name", request.get("name") or ""),
        ("namespace", request.get("namespace") or ""),
    ):
        if value:
            out[key] = value
    return out, {**gvr, "name": request.get("name") or ""}, sub


class Policy:
    """One ValidatingAdmissionPolicy with one binding, compiled."""

    def __init__(self, policy: dict[str, Any], binding: dict[str, Any]) -> None:
        self.name: str = policy["metadata"]["name"]
        self.binding: str = binding["metadata"]["name"]
        spec, bspec = policy["spec"], binding["spec"]
        for fields, allowed, what in (
            (spec, _POLICY_FIELDS, "policy spec"),
            (spec.get("matchConstraints", {}), _CONSTRAINT_FIELDS, "matchConstraints"),
            (bspec, _BINDING_FIELDS, "binding spec"),
        ):
            unsupported = set(fields) - allowed
            if unsupported:
                raise PolicyError(f"{self.name}: {what} fields not implemented: {sorted(unsupported)}")
        if bspec["policyName"] != self.name:
            raise PolicyError(f"binding {self.binding} is for {bspec['policyName']}, not {self.name}")
        self.failure_policy: str = spec.get("failurePolicy", "Fail")
        self.deny: bool = "Deny" in bspec["validationActions"]
        constraints = spec.get("matchConstraints", {})
        self.rules: list[dict[str, Any]] = constraints.get("resourceRules", [])
        self.exclude: list[dict[str, Any]] = constraints.get("excludeResourceRules", [])
        self.conditions = [
            (c["name"], _Expression.compile(c["expression"], f"matchCondition {c['name']}"))
            for c in spec.get("matchConditions", [])
        ]
        self.variables = [
            (v["name"], _Expression.compile(v["expression"], f"variable {v['name']}"))
            for v in spec.get("variables", [])
        ]
        self.validations = []
        for n, v in enumerate(spec.get("validations", [])):
            message = v.get("message", "")
            if "\n" in message:
                raise PolicyError(f"validation {n}: message must not contain line breaks")
            expr = _Expression.compile(v["expression"], f"validation {n}")
            msg_expr = (
                _Expression.compile(v["messageExpression"], f"validation {n} messageExpression")
                if "messageExpression" in v
                else None
            )
            self.validations.append((expr, message, msg_expr, v.get("reason", "Invalid")))

    def matches(self, operation: str, gvr: dict[str, str], sub: str) -> bool:
        return any(_rule_matches(r, operation, gvr, sub) for r in self.rules) and not any(
            _rule_matches(r, operation, gvr, sub) for r in self.exclude
        )

    def review(self, request: dict[str, Any]) -> Denial | None:
        cel_request, gvr, sub = _admission_request(request)
        if not self.matches(request["operation"], gvr, sub):
            return None
        bindings = {
            "object": request.get("object"),
            "oldObject": request.get("oldObject"),
            "request": cel_request,
            "params": None,
        }
        denials: list[Denial] = []

        def fail(message: str) -> None:
            if self.failure_policy == "Fail":
                denials.append(Denial(self.name, self.binding, message))

        # matchConditions: any false skips the policy; otherwise an error is a failure.
        errors = []
        for _, condition in self.conditions:
            try:
                if condition.run(bindings, {}, {}) is False:
                    return None
            except _EvalError as err:
                errors.append(str(err))
        if errors:
            fail(errors[0])
            return denials[0] if denials and self.deny else None

        # Variables in order, each seeing those before it. One that fails is left out, with its error.
        variables: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for name, expr in self.variables:
            try:
                variables[name] = expr.run(bindings, variables, failed)
            except _EvalError as err:
                failed[name] = str(err)

        for expr, message, msg_expr, reason in self.validations:
            try:
                result = expr.run(bindings, variables, failed)
            except _EvalError as err:
                fail(str(err))
                continue
            if result is True:
                continue
            text = _evaluated_message(msg_expr, bindings, variables, failed)
            text = text or message.strip() or f"failed expression: {expr.source.strip()}"
            denials.append(Denial(self.name, self.binding, text, reason))
        return denials[0] if denials and self.deny else None


def _evaluated_message(
    msg_expr: _Expression | None, bindings: dict[str, Any], variables: dict[str, Any], failed: dict[str, str]
) -> str:
    """A validation's messageExpression's value; empty when it has none, it fails, or its value is
    no string, over the size limit or on several lines (the static message is used then)."""
    if msg_expr is None:
        return ""
    try:
        value = msg_expr.run(bindings, variables, failed)
    except _EvalError:
        return ""
    if not isinstance(value, str):
        return ""
    text = value.strip()
    return "" if len(text.encode()) > MAX_MESSAGE_BYTES or "\n" in text else text


def load(path: Path = POLICY_FILE) -> list[Policy]:
    """Every ValidatingAdmissionPolicy in the file, each with its binding there."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    out = []
    for binding in bindings:
        name = binding["spec"]["policyName"]
        if name not in policies:
            raise PolicyError(f"binding {binding['metadata']['name']} names no policy in {path}")
        out.append(Policy(policies[name], binding))
    unbound = set(policies) - {b["spec"]["policyName"] for b in bindings}
    if unbound:
        raise PolicyError(f"policies without a binding (they would do nothing): {sorted(unbound)}")
    return out


@cache
def _shipped() -> list[Policy]:
    return load()


def review(request: dict[str, Any]) -> Denial | None:
    """The first denial of the shipped policies for this request, or None if they allow it."""
    for policy in _shipped():
        denial = policy.review(request)
        if denial is not None:
            return denial
    return None


def admit(request: dict[str, Any]) -> str | None:
    """None if the shipped admission policies allow the write, else the API server's denial message."""
    denial = review(request)
    return None if denial is None else str(denial)
