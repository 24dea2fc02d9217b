"""One re-query, from trigger to stored events: the notifier (watches and timer), the reactor
(query, decode, diff) and the committer (events and state in one transaction)."""
