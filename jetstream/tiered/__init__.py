"""Tiered storage: sealed segments offloaded to a BLOB store as content-addressed fragments
(Gazette's design), a fragment index from the store's listings, and reads below the local
log start served from the store. Pure cores (names, codec, index, planner) and thin shells
(store, offload, reader)."""
