"""The official Kubernetes OpenAPI schemas, strict, as the fake API server's schema check
(kubernetes_validate is a test dependency, so the tests plug this in; the shipped demo runs
without it)."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from watcher.sim.apiserver import SchemaViolation

__all__ = ["OpenApiSchemas", "strict_schemas"]

log = logging.getLogger(__name__)


class OpenApiSchemas:
    """A `SchemaCheck`: the first violation of the object's schema in `version`, strict (an
    unknown field is a violation)."""

    def __init__(self, module: ModuleType, version: str) -> None:
        self._module, self.version = module, version

    def __call__(self, obj: dict[str, Any]) -> SchemaViolation | None:
        try:
            self._module.validate(obj, self.version, strict=True)
        except self._module.ValidationError as err:
            return _violation(err)
        return None


def _violation(err: Any) -> SchemaViolation:
    """A jsonschema ValidationError in the server's terms."""
    unknown: tuple[str, ...] = ()
    if err.validator == "additionalProperties":
        unknown = tuple(sorted(set(err.instance) - set(err.schema.get("properties", {}))))
    missing = ""
    if err.validator == "required" and "'" in err.message:
        missing = err.message.split("'")[1]
    return SchemaViolation(
        keyword=err.validator,
        path=tuple(err.path),
        message=err.message,
        unknown_fields=unknown,
        value_type=type(err.instance).__name__,
        schema_type=str(err.validator_value),
        missing=missing,
    )


def strict_schemas() -> OpenApiSchemas | None:
    """The newest schemas kubernetes_validate bundles; None, and a warning, when it is missing."""
    try:
        module = importlib.import_module("kubernetes_validate")
        utils = importlib.import_module("kubernetes_validate.utils")
    except ImportError:
        log.warning("fake apiserver: kubernetes_validate is not installed: schema validation is OFF")
        return None
    return OpenApiSchemas(module, str(utils.latest_version()))
