"""What the agent reads besides the kubelet's pod-resources answers: each a `Source` (base.py)."""
