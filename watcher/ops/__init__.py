"""Operating the agent: Prometheus metrics, the HTTP endpoints and the logs."""
