"""Key-compacted streams: the log cleaner (a pure planner and rewrite rule, driven by an IO
executor) and the key index that serves the latest committed value of each key."""
