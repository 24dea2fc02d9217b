"""The pure pod and device-health model: what the Pods API says of pods (pods), who a change hits
(affected), DRA device verdicts from the Pod status and ResourceSlice taints (verdicts, taints,
events, holders), and a device plugin's device corroborated (plugin_devices). No I/O, no clock."""
