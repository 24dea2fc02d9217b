"""Simulation: the fake kubelet and its node, the demo, and synthetic events for `send-test`."""
