"""pod-resources-watcher: turns the kubelet's pod-resources API into a stream of change events."""

from __future__ import annotations

import os

# gRPC's C-core logs straight to stderr, bypassing Python logging, and reads its
# verbosity once at import time: silence it before anything imports grpc. An
# operator who wants the raw lines can still set GRPC_VERBOSITY themselves.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_TRACE", "")

__version__ = "0.1.0"
__all__ = ["__version__"]
