"""Support for the tests and the benchmarks, never shipped in the wheel.

Receivers, ports, waits, certificates and the real servers the tests run (a NATS cluster): the
small helpers written once, here, and shared by `tests/` and `bench/` (which never import each
other). The wheel carries only `watcher*`; nothing under `watcher/` imports this package.
"""
