"""Security: TLS for every link (tls), the secure-by-default check of listeners (guard)."""
