"""Replication: the leader's ISR and high watermark (`leader`) and the follower's truncation
by leader epoch (`follower`). Both are pure state machines driven by the broker's async shell;
the leader epoch cache itself lives with the log (jetstream.stream.epoch)."""
