"""Append expectations and idempotent publishing: the pure per-partition guard, the record
headers that carry it in the log, and the replay that rebuilds it on a new leader."""
