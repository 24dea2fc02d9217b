"""The JetStream stream the events land in: there (or created, where the settings allow), led,
and taking this node's subjects."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from watcher.sinks.nats.settings import NatsSinkSettings
from watcher.sinks.nats.subjects import node_token

if TYPE_CHECKING:  # imported for real only when the sink is used
    import nats.js.client

__all__ = ["StreamError", "ensure_stream"]

log = structlog.get_logger("watcher.sinks.nats")


class StreamError(Exception):
    """The stream is missing (and not ours to create) or does not take our subjects."""


def _takes(pattern: str, subject: str) -> bool:
    """Whether a stream subject (with * and > wildcards) matches `subject`."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


async def ensure_stream(js: nats.js.client.JetStreamContext, settings: NatsSinkSettings, node: str) -> None:
    """The stream exists (created when `create_stream`) and takes this node's subjects; raises
    StreamError saying what to do otherwise. A duplicate window shorter than `max_age` is logged."""
    import nats.js.errors
    from nats.js.api import StorageType, StreamConfig

    s = settings
    probe = f"{s.subject_prefix}.{node_token(node)}.device.removed"
    try:
        info = await js.stream_info(s.stream)
    except nats.js.errors.NotFoundError:
        if not s.create_stream:
            raise StreamError(
                f"stream {s.stream} does not exist: create it (subjects {s.subject_prefix}.>, a duplicate "
                f"window of at least {s.max_age:g} s; docs/nats.md) or set create_stream = true"
            ) from None
        info = await js.add_stream(
            StreamConfig(
                name=s.stream,
                subjects=[f"{s.subject_prefix}.>"],
                storage=StorageType.FILE,
                num_replicas=s.stream_replicas,
                duplicate_window=s.duplicate_window,
                max_age=s.stream_max_age or None,
            )
        )
        log.info(
            "created the stream",
            sink=s.name,
            stream=s.stream,
            replicas=s.stream_replicas,
            duplicate_window_s=s.duplicate_window,
        )
    # A replicated stream answers publishes only once its replicas elect a leader (just created,
    # or mid-election): wait for that, bounded, rather than fail a delivery with "no responders".
    loop = asyncio.get_running_loop()
    deadline = loop.time() + s.timeout
    while info.cluster is not None and not info.cluster.leader and loop.time() < deadline:
        await asyncio.sleep(0.05)
        info = await js.stream_info(s.stream)
    subjects = info.config.subjects or []
    if not any(_takes(p, probe) for p in subjects):
        raise StreamError(
            f"stream {s.stream} does not take {s.subject_prefix}.> (its subjects: {', '.join(subjects)}); "
            "add the subjects to it or set subject_prefix"
        )
    window = info.config.duplicate_window or 0.0
    if window < s.max_age:
        log.warning(
            "the stream's duplicate window is shorter than max_age: an event re-published after that "
            "long (a long outage, then a lost acknowledgement) would be stored twice",
            sink=s.name,
            stream=s.stream,
            duplicate_window_s=window,
            max_age_s=s.max_age,
        )
