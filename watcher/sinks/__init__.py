"""Where events go. Sinks know nothing of the kubelet: they get events, in `seq` order, and
answer with an Outcome that the one retry policy in `watcher.delivery.worker` acts on.

`base` holds what every sink shares, `registry` the sink types; each other module is
one sink type (registering itself) or a helper of some (`http`, `audit`). A sink type with
more to it than one module holds is a package (`file`, `nats`, `kubernetes`) whose `sink` module
registers it, once, when the package is imported."""
