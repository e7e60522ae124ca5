"""The `jetstream` command line: argument parsing and configuration precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from jetstream.cli import build_parser, main
from jetstream.errors import InvalidConfig
from jetstream.server.config import BrokerConfig


def test_unknown_command_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_server_flags_map_to_broker_config_fields() -> None:
    args = build_parser().parse_args(["server", "--port", "7401", "--data-dir", "/tmp/x",
                                      "--fetch-bytes-max", "4096"])
    assert (args.port, args.data_dir, args.fetch_bytes_max) == (7401, "/tmp/x", 4096)
    assert args.broker_id is None  # unset flags do not override file or environment


def test_config_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "broker.toml"
    file.write_text('port = 7001\nhttp_port = 7002\ndata_dir = "/srv/js"\nbroker_id = 3\n')
    config = BrokerConfig.load(file, env={"JETSTREAM_PORT": "7101", "JETSTREAM_BROKERS": "x",
                                          "JETSTREAM_HTTP_PORT": "7102"},
                               overrides={"port": 7201, "broker_id": None})
    assert (config.port, config.http_port, config.data_dir, config.broker_id) == (
        7201, 7102, "/srv/js", 3)


@pytest.mark.parametrize(
    ("file_text", "env", "field"),
    [
        ("colour = 1\n", {}, "colour"),
        ("port = 70000\n", {}, "port"),
        ("port = 'high'\n", {}, "port"),
        ("", {"JETSTREAM_PORT": "high"}, "port"),
        ("port = [\n", {}, "config"),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, file_text: str, env: dict[str, str],
                                    field: str) -> None:
    file = tmp_path / "broker.toml"
    file.write_text(file_text)
    with pytest.raises(InvalidConfig) as exc:
        BrokerConfig.load(file, env=env)
    assert exc.value.fields["field"] == field


def test_server_reports_a_bad_config_as_an_error_with_its_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "broker.toml"
    file.write_text("colour = 1\n")
    assert main(["server", "--config", str(file)]) == 1
    assert "error [INVALID_CONFIG]" in capsys.readouterr().err
