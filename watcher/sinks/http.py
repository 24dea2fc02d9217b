"""What every HTTP sink shares: one aiohttp session, TLS, timeouts, and reading the answer.

The answer becomes an Outcome the retry policy acts on: 2xx delivered; 408,
429 and 5xx retried, `Retry-After` (seconds or HTTP date) honoured on 429 and
503 (the delivery worker caps it at the sink's `retry_after_max`; a value that
is neither is ignored, so the normal backoff applies); 410 disables the sink;
any other 4xx (and 3xx: redirects are not followed) is permanent. Error text
never carries a secret (`redact`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import aiohttp

from watcher import __version__
from watcher.ratelimit import RateLimiter
from watcher.retry_after import parse_retry_after
from watcher.secrets import redact
from watcher.sinks.base import HttpSinkSettings, Outcome
from watcher.tls import client_context

__all__ = ["HttpClient", "HttpSink", "parse_retry_after", "outcome_of", "USER_AGENT", "HTTP_SINK_CONNECTIONS"]

USER_AGENT = f"pod-resources-watcher/{__version__}"
MAX_BODY_BYTES = 64 * 1024
# Connections one HTTP sink keeps open at most (and so file descriptors: the agent's fd budget).
HTTP_SINK_CONNECTIONS = 4
# RFC 9110 delta-seconds: ASCII digits only. str.isdigit() also takes "²" or "٣", which float()
# then refuses: that raised here once, and the event was dead-lettered as if refused for good.


def outcome_of(status: int, headers: Mapping[str, str], body: str) -> Outcome:
    # Redact before cutting: a cut through a secret would leave part of it behind.
    text = redact(body.strip())[:200]
    if 200 <= status < 300:
        return Outcome.ok(status)
    error = f"HTTP {status}" + (f": {text}" if text else "")
    if status == 410:
        return Outcome(gone=True, status=status, error=error)
    if status in (408, 429) or status >= 500:
        retry_after = parse_retry_after(headers.get("Retry-After")) if status in (429, 503) else None
        return Outcome(retry=True, retry_after=retry_after, status=status, error=error)
    if 300 <= status < 400:
        error += " (redirects are not followed: configure the final URL)"
    return Outcome(status=status, error=error)


class HttpClient:
    """A lazily created aiohttp session with the sink's TLS and timeout settings."""

    def __init__(
        self,
        *,
        timeout: float,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        tls_verify: bool = True,
    ) -> None:
        self.timeout = timeout
        self.ca_file = ca_file
        self.cert_file = cert_file
        self.key_file = key_file
        self.tls_verify = tls_verify
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def for_sink(cls, settings: HttpSinkSettings) -> HttpClient:
        return cls(
            timeout=settings.timeout,
            ca_file=settings.ca_file,
            cert_file=settings.cert_file,
            key_file=settings.key_file,
            tls_verify=settings.tls_verify,
        )

    def _ssl(self) -> ssl.SSLContext:
        return client_context(self.ca_file, self.cert_file, self.key_file, verify=self.tls_verify)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=self._ssl(), limit=HTTP_SINK_CONNECTIONS),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Outcome:
        try:
            async with self.session().post(
                url, data=body, headers=dict(headers), allow_redirects=False
            ) as response:
                # Only the start of the body matters (an error message); a receiver that
                # answers with megabytes must not cost us megabytes.
                head = await response.content.read(MAX_BODY_BYTES)
                text = head.decode(response.charset or "utf-8", errors="replace")
                return outcome_of(response.status, response.headers, text)
        except TimeoutError:
            return Outcome(retry=True, error=f"no answer within {self.timeout:g} s")
        except (aiohttp.ClientError, ssl.SSLError, OSError) as err:
            return Outcome(retry=True, error=redact(f"{type(err).__name__}: {err}"))
        except ValueError as err:
            # A request that can never be sent (e.g. a header aiohttp refuses): retrying would
            # block the queue behind it forever, so it is permanent.
            return Outcome(error=redact(f"request refused before sending: {err}"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            # Lets the connector's transports finish closing (aiohttp's advice).
            await asyncio.sleep(0)
            self._session = None


class HttpSink:
    """What the HTTP sinks share: a client made from their settings, requests paced one by one,
    no background loop unless they add one, and closing the client.

    A sink of this kind may send fewer requests than it is given events (PagerDuty sends nothing
    for the end of a condition it never opened), so its delivery worker hands it the sink's rate
    limiter and it spends a slot per request it actually sends, not per event.
    """

    http: HttpClient
    limiter: RateLimiter | None = None

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Outcome:
        limiter = self.limiter
        if limiter is None:
            return await self.http.post(url, body, headers)
        slot = await limiter.acquire()
        try:
            return await self.http.post(url, body, headers)
        finally:
            # The slot counts from the answer: the receiver saw the request somewhere between the
            # slot and now (later on a busy machine), and only the later time keeps every second
            # at the receiver within the rate (Slack: one message a second to a channel).
            limiter.answered_slot(slot)

    def background(self) -> Callable[[], Awaitable[None]] | None:
        return None

    async def close(self) -> None:
        await self.http.close()
