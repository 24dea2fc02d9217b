"""The kubelet's Pods API: its client, the decoding of its Pods, the watch and its checks, and the
reads of the pods it names changed. Everything the agent knows of pods beyond their holdings."""
