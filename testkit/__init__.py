"""Support for the tests and the benchmarks, never shipped in the wheel.

Receivers, ports, waits, certificates and the real servers the tests run (a NATS cluster): the
small helpers written once, here, and shared by `tests/` and `bench/` (which never import each
other). The wheel carries only `watcher*`; nothing under `watcher/` imports this package.

- agent: an Agent running against a fake kubelet, its events and cycles awaitable; settings and
  TOML configs for it
- fake_kubelets: fake kubelets a test starts, each stopped after it (the `start_kubelet` fixture)
- changes, waiting: awaiting what this process's callbacks change; polling what another process does
- http_server, receiver, receivers: a loopback server for a test's own handler; the recording,
  scriptable receiver; Slack, PagerDuty and webhook receivers that enforce each service's rules
- dispatching: the real Dispatcher on a real outbox, its deliveries awaitable
- http_sinks: events, each HTTP sink's settings and a DRA device's story for the sinks' tests
- permissions: a path's permission bits, a umask for the length of a test
- certificates, ports, disks, processes: openssl-made PKI, free ports, filesystems that fill up or
  fail, the fake kubelet as a child process
- nats_cluster, store_kill_point, nats_kill_point: a JetStream cluster on loopback; the CLI with a
  kill point armed (run as `python -m testkit.store_kill_point` / `testkit.nats_kill_point`)
- manifests, admission_policy, promql, helm_chart: deploy/ read and built as kustomize does; the
  shipped admission policy's CEL run; PromQL in the shipped files checked; the chart rendered by helm
- node_model, node_rendering, node_mutations, inventories: random nodes for the property tests,
  rendered into kubelet responses, changed for real; small inventories from a few names
- planted_secret: the secret that no captured output may show
- hostile_text: characters no person may be shown as they are (zero-width, bidi, tags, combining
  marks), and a check, by Unicode category, that a text shows none
"""
