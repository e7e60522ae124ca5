"""The README's examples run as written, against a real broker: every ```python block marked
`# README example` and every ```sh block marked `# README CLI example`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jetstream.server.process import BrokerProcess

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_TIMEOUT_S = 60
_BLOCK = re.compile(r"```(python|sh)\n(.*?)```", re.S)


def blocks(kind: str, marker: str) -> list[str]:
    return [body for lang, body in _BLOCK.findall(README.read_text())
            if lang == kind and body.lstrip().startswith(marker)]


def env_for(broker: BrokerProcess) -> dict[str, str]:
    env = dict(os.environ, JETSTREAM_BROKERS=broker.address)
    # The venv's scripts (the `jetstream` command) come first on PATH.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def run(argv: list[str], broker: BrokerProcess) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, env=env_for(broker), capture_output=True, text=True,
                          timeout=EXAMPLE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv[:2]} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_readme_has_the_examples_this_file_runs() -> None:
    assert len(blocks("python", "# README example")) >= 3
    assert len(blocks("sh", "# README CLI example")) == 1


@pytest.mark.parametrize("index", range(len(blocks("python", "# README example"))))
def test_python_example_runs(index: int, broker: BrokerProcess) -> None:
    code = blocks("python", "# README example")[index]
    run([sys.executable, "-c", code], broker)


def test_cli_example_runs(broker: BrokerProcess) -> None:
    script = blocks("sh", "# README CLI example")[0]
    done = run(["bash", "-euo", "pipefail", "-c", script], broker)
    assert "hello" in done.stdout
