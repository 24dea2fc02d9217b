"""The audit log's head file: the last record's n and hash, MAC'd when the log is keyed.

The head file (`.NAME.head` beside the log, hidden so `NAME*` globs and log shippers never take it
for a log file) is replaced by the file sink after the records it names are on disk. It is what
shows a cut tail: the log's last record must be the one it names (or come after it, when the agent
stopped between the two writes). It cannot show a tail cut by someone who also put back an older
head file.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watcher.sinks.audit.chain import canonical_json, hmac_digest

__all__ = ["Head", "HeadError", "head_path", "is_head_file"]

# A head's MAC covers this label too, so no record's MAC can pass for a head's, or back.
_HEAD_LABEL = "pod-resources-watcher.audit-head/v1"


def head_path(log: Path) -> Path:
    """Where the head file of the log `log` lives."""
    return log.with_name(f".{log.name}.head")


def is_head_file(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".head")


class HeadError(ValueError):
    """A head file that is not one."""


@dataclass(frozen=True)
class Head:
    """The last record the log held on disk when the file sink last saved it: n and hash, and
    with a key, a MAC over both (so it cannot be rewritten to match a cut log without the key)."""

    n: int
    hash: str
    mac: str | None = None

    @classmethod
    def keyed(cls, n: int, digest: str, key: bytes | None) -> Head:
        return cls(n, digest, None if key is None else _head_mac(key, n, digest))

    def mac_ok(self, key: bytes) -> bool:
        return self.mac is not None and hmac.compare_digest(self.mac, _head_mac(key, self.n, self.hash))

    def to_line(self) -> str:
        fields: dict[str, Any] = {"n": self.n, "hash": self.hash}
        if self.mac is not None:
            fields["mac"] = self.mac
        return canonical_json(fields).decode() + "\n"

    @classmethod
    def parse(cls, text: bytes) -> Head:
        try:
            fields = json.loads(text)
            n, digest, mac = fields["n"], fields["hash"], fields.get("mac")
            valid = (
                set(fields) <= {"n", "hash", "mac"}
                and isinstance(n, int)
                and n >= 1
                and isinstance(digest, str)
                and isinstance(mac, str | None)
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            valid = False
        if not valid:
            raise HeadError("not a head file (expected {n, hash[, mac]})")
        return cls(n, digest, mac)

    @classmethod
    def read(cls, path: Path) -> Head | None:
        """The head saved at `path`; None when there is none; HeadError when it is not one."""
        try:
            return cls.parse(path.read_bytes())
        except FileNotFoundError:
            return None


def _head_mac(key: bytes, n: int, digest: str) -> str:
    return hmac_digest(key, canonical_json({"head": _HEAD_LABEL, "n": n, "hash": digest}))
