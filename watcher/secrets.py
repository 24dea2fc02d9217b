"""Secrets from the config: inline, `${ENV}` references, or `*_file` paths re-read when they change.

A Secret never prints its value (repr, str, logs, errors, `check-config`), and
every value ever resolved is registered so `redact()` can scrub it out of any
text that might reach a log line or an error message. A secret that is a URL
registers its parts too (credentials, path, query): a receiver that echoes only
the path it was called on must not put a webhook's token into our logs.
`redact()` also scrubs what looks like a credential whoever it belongs to: URL
credentials (`user:pass@`), URL query strings, `Authorization:` values and
`Bearer` tokens.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "file_exposure",
    "ENV_REF",
    "Secret",
    "SecretError",
    "redact",
    "redact_url",
    "remember_header",
    "remember_url_credentials",
    "expand_env",
]

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_known: set[str] = set()
_known_lock = threading.Lock()
REDACTED = "***"
# Very short values would redact innocent text everywhere; real secrets are long.
_MIN_SECRET = 6

# Credentials in any text, known to us or not: an error from a library may quote a URL or a
# header we never registered (a redirect target, a proxy's answer).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@\"'<>]+@")
_QUERY = re.compile(r"(?i)\b(https?://[^\s?#\"'<>]+)\?[^\s#\"'<>]+")
# A credential after "Authorization:" (any scheme), or after the word Bearer. Lower-case
# "bearer" and "basic" are left alone: they are words in ordinary messages too.
_AUTHORIZATION = re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:[a-z]+\s+)?[^\s\"',;}]+")
_BEARER = re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/=-]{6,}")


class SecretError(ValueError):
    """A secret could not be resolved (unset variable, unreadable or empty file)."""


# Header (and query parameter) names that carry credentials. Other values (X-Cluster =
# "prod-eu-1", ?tenant=production) are not registered: they often repeat names that appear in
# ordinary log lines (a node called gpu-prod-eu-1-17), which would be scrubbed too.
# `check-config` shows every header value as ***.
_CREDENTIAL_HEADER = re.compile(r"(?i)auth|cookie|key|token|secret|passw|signature|session|credential")


# A path segment this long in a secret URL is taken for a token on its own (Slack's
# /services/T0/B0/TOKEN): a receiver may quote it without the rest of the path. Shorter ones
# (`services`, `hooks`) are ordinary words that would be scrubbed from every log line.
_TOKEN_SEGMENT = 16


def _url_parts(value: str, *, path: bool) -> list[str]:
    """The parts of URL `value` that are credentials, raw and percent-decoded; [] if not a URL.

    Its userinfo (and password) and its query string always. Query values: with `path` (the
    URL is a secret as a whole) every one; otherwise only those whose name says credential
    (`?token=...`), not `?tenant=production`, whose value may be any word. With `path`, the
    path too: with and without its leading slash, and each segment long enough to be a token.
    """
    try:
        parts = urlsplit(value)
    except ValueError:
        return []
    if not parts.scheme or not parts.netloc:
        return []
    found: list[str] = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        found += [userinfo, userinfo.partition(":")[2]]
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        found += [parts.query, *(v for k, v in pairs if path or _CREDENTIAL_HEADER.search(k))]
    if path and parts.path:
        segments = [seg for seg in parts.path.split("/") if len(seg) >= _TOKEN_SEGMENT]
        found += [parts.path, parts.path.lstrip("/"), *segments]
    return [*found, *(unquote(f) for f in found)]


def _add(values: list[str]) -> None:
    values = [v for v in values if len(v) >= _MIN_SECRET]
    if values:
        with _known_lock:
            _known.update(values)


def _remember(value: str) -> str:
    # A secret URL is secret as a whole, so its path is too (a webhook's token lives there).
    _add([value, *_url_parts(value, path=True)])
    return value


def remember_header(name: str, value: str) -> str:
    """Treat a header's value as a secret when its name says it is a credential (Authorization,
    Cookie, X-Api-Key, ...). A ${ENV} value in it is registered when it is expanded, whatever
    the name."""
    if _CREDENTIAL_HEADER.search(name):
        _remember(value)
    return value


def remember_url_credentials(url: str) -> None:
    """Treat the credentials in a URL that is not itself secret (its userinfo and query) as secrets."""
    _add(_url_parts(url, path=False))


def redact_url(url: str) -> str:
    """`url` as it may be shown: credentials (`user:pass@`) and the query replaced by ***."""
    return _QUERY.sub(rf"\1?{REDACTED}", _USERINFO.sub(rf"\1{REDACTED}@", url))


def redact(text: str) -> str:
    """`text` with every known secret value, URL credentials and query strings, Authorization
    values and Bearer tokens replaced by ***."""
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    text = redact_url(text)
    text = _AUTHORIZATION.sub(rf"\1{REDACTED}", text)
    return _BEARER.sub(rf"\1{REDACTED}", text)


def expand_env(text: str) -> str:
    """Replace `${NAME}` with the environment variable; an unset one is an error."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        value = os.environ.get(name)
        if value is None:
            raise SecretError(f"environment variable {name} is not set")
        return _remember(value)

    return ENV_REF.sub(sub, text)


def file_exposure(path: Path) -> str | None:
    """What is wrong with a secret file that group or others may read or write, and what to do;
    None for a private one, or one that cannot be read now (reading it says why)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (
        f"secret file {path} is open to group or others (mode {mode:04o}): "
        f"chmod 600 {path} (the agent only reads it)"
    )


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

    def exposure(self) -> str | None:
        """For a secret file that group or others may read or write: what is wrong and what to
        do; None otherwise (an inline or ${ENV} secret, a private file, a file not readable now)."""
        return None if self._file is None else file_exposure(self._file)

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
