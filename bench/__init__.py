"""Benchmark programs (STYLE.md section 10): run one with `python -m bench.<name>`.

The brokers a bench starts (`python -m jetstream`) load the package's bytecode, as an
installed package's would: it is compiled here once. Under PYTHONDONTWRITEBYTECODE nothing
else writes it, and each broker would compile every module again as it starts (0.6-0.8 s
of CPU per process on this machine, three processes at once in a cluster restart)."""

import compileall
from pathlib import Path

compileall.compile_dir(Path(__file__).parent.parent / "jetstream", quiet=1)
