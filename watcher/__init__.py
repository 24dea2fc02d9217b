"""pod-resources-watcher: turns the kubelet's pod-resources API into a stream of change events."""

from __future__ import annotations

import os

# gRPC's C-core logs straight to stderr, bypassing Python logging, and reads its
# verbosity once at import time: set it before anything imports grpc. ERROR, not
# NONE: when the C-core aborts the process (it does, e.g. when it cannot create an
# epoll descriptor), its last line is the only account of why. Its info and
# warning chatter stays quiet. An operator can still set GRPC_VERBOSITY themselves.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("GRPC_TRACE", "")

__version__ = "0.1.0"
__all__ = ["__version__"]
