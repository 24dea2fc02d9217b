"""Secrets from the config: inline, `${ENV}` references, or `*_file` paths re-read when they change.

A Secret never prints its value (repr, str, logs, errors, `check-config`), and
every value ever resolved is registered so `redact()` can scrub it out of any
text that might reach a log line or an error message.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

__all__ = ["ENV_REF", "Secret", "SecretError", "redact", "expand_env"]

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_known: set[str] = set()
_known_lock = threading.Lock()
REDACTED = "***"


class SecretError(ValueError):
    """A secret could not be resolved (unset variable, unreadable or empty file)."""


def _remember(value: str) -> str:
    # Very short values would redact innocent text everywhere; real secrets are long.
    if len(value) >= 6:
        with _known_lock:
            _known.add(value)
    return value


def redact(text: str) -> str:
    """`text` with every known secret value replaced by ***."""
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def expand_env(text: str) -> str:
    """Replace `${NAME}` with the environment variable; an unset one is an error."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        value = os.environ.get(name)
        if value is None:
            raise SecretError(f"environment variable {name} is not set")
        return _remember(value)

    return ENV_REF.sub(sub, text)


class Secret:
    """A value resolved on use. `describe()` says where it comes from, never what it is."""

    def __init__(self, *, value: str | None = None, file: Path | None = None) -> None:
        if (value is None) == (file is None):
            raise ValueError("a Secret needs exactly one of value or file")
        self._template = value
        self._file = file
        self._cache: tuple[tuple[int, int, int], str] | None = None
        if value is not None:
            # Resolve now so an unset variable is a config error, not a runtime one.
            self.get()

    def describe(self) -> str:
        if self._file is not None:
            return f"file {self._file}"
        assert self._template is not None
        refs = ENV_REF.findall(self._template)
        return f"env {', '.join(refs)}" if refs else "inline value"

    def get(self) -> str:
        if self._template is not None:
            return _remember(expand_env(self._template))
        assert self._file is not None
        try:
            st = os.stat(self._file)
        except OSError as err:
            raise SecretError(f"cannot read secret file {self._file}: {err.strerror}") from err
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is None or self._cache[0] != stamp:
            try:
                text = self._file.read_text().strip()
            except OSError as err:
                raise SecretError(f"cannot read secret file {self._file}: {err.strerror}") from err
            if not text:
                raise SecretError(f"secret file {self._file} is empty")
            self._cache = (stamp, _remember(text))
        return self._cache[1]

    def __repr__(self) -> str:
        return f"Secret({self.describe()})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._template == self._template and other._file == self._file

    def __hash__(self) -> int:
        return hash((self._template, self._file))
