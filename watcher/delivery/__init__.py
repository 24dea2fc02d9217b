"""From the outbox to the sinks: one worker per sink under the dispatcher's supervisor."""
