"""Consumer offsets and consumer groups: the records of `__offsets`, the sticky assignor and
the group state machine (pure cores; the broker's coordinator drives them)."""
