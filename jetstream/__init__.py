"""Jetstream: a replicated commit log for NATS."""
