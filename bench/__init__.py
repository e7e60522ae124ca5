"""Benchmark programs (STYLE.md section 10): run one with `python -m bench.<name>`."""
