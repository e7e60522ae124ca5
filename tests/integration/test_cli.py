"""The `jetstream` command line as a user runs it: `python -m jetstream ...` subprocesses
against a real broker (the `broker` fixture) or a real `jetstream dev`.

Every wait has a deadline: one-shot commands run with a timeout, and the output of long-running
ones (`sub --follow`, `dev`) is read line by line with select() until a deadline. Every process
a test starts is stopped by PID in teardown (the `procs` fixture).
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jetstream.server.process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 20.0
LINE_TIMEOUT_S = 10.0
DEV_READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 10.0


def cli_env(brokers: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JETSTREAM_BROKERS"}
    if brokers is not None:
        env["JETSTREAM_BROKERS"] = brokers
    return env


def jetstream(brokers: str | None, *args: str, stdin: bytes | None = None,
              ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `python -m jetstream ARGS` to completion (within the deadline)."""
    feed: dict[str, Any] = {"input": stdin} if stdin is not None else {
        "stdin": subprocess.DEVNULL}
    proc = subprocess.run([sys.executable, "-m", "jetstream", *args], cwd=REPO,
                          env=cli_env(brokers), capture_output=True,
                          timeout=COMMAND_TIMEOUT_S, **feed)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                         proc.stderr.decode())
    if ok:
        assert result.returncode == 0, f"{args} failed: {result.stderr}"
    return result


def json_of(brokers: str, *args: str) -> Any:
    return json.loads(jetstream(brokers, *args, "--json").stdout)


def json_lines(brokers: str, *args: str) -> list[dict[str, Any]]:
    out = jetstream(brokers, *args).stdout
    return [json.loads(line) for line in out.splitlines()]


class Procs:
    """Long-running CLI processes of one test, stopped by PID when it ends."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.extra_pids: list[int] = []

    def start(self, brokers: str | None, *args: str,
              stderr_path: Path | None = None) -> subprocess.Popen[bytes]:
        with open(stderr_path or os.devnull, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "jetstream", *args], cwd=REPO,
                                    env=cli_env(brokers), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=stderr, bufsize=0)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(EXIT_TIMEOUT_S)
            if proc.stdout is not None:
                proc.stdout.close()
        for pid in self.extra_pids:
            if _is_nats_server(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def procs() -> Iterator[Procs]:
    running = Procs()
    try:
        yield running
    finally:
        running.stop_all()


class Lines:
    """Reads a child's stdout line by line, each line within a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout_s: float = LINE_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no line from {self.proc.args} within {timeout_s} s")
            readable, _, _ = select.select([self.fd], [], [], remaining)
            if readable:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    pytest.fail(f"{self.proc.args} exited ({self.proc.wait(EXIT_TIMEOUT_S)}) "
                                f"before printing a line")
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


def _is_nats_server(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "nats-server"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # fields after "(comm)": state, ppid, ...
            found.append(int(stat.parent.name))
    return found


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _is_nats_server(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- streams -----------------------------------------------------------------------------------


def test_stream_create_list_info_delete_human(broker: BrokerProcess) -> None:
    brokers = broker.address
    out = jetstream(brokers, "stream", "create", "orders", "--subject", "orders.*",
                    "--label", "app=shop", "--label", "env=prod").stdout
    assert "stream orders ready" in out and "orders.*" in out
    jetstream(brokers, "stream", "create", "audit", "--subject", "audit", "--partitions", "2",
              "--ack-policy", "leader", "--retention-ms", "60000", "--label", "env=dev")

    listing = jetstream(brokers, "stream", "list").stdout.splitlines()
    assert listing[0].split() == ["NAME", "SUBJECT", "PARTITIONS", "RF", "ACK", "INGEST_GROUP",
                                  "LABELS"]
    assert [line.split()[0] for line in listing[1:]] == ["audit", "orders"]
    selected = jetstream(brokers, "stream", "list", "--selector", "env in (prod)").stdout
    assert "orders" in selected and "audit" not in selected

    info = jetstream(brokers, "stream", "info", "audit").stdout
    assert "ack policy          leader" in info
    assert "retention ms        60000" in info
    assert "audit.1" in info  # partition 1's subject, in the partition table

    assert jetstream(brokers, "stream", "delete", "audit").stdout.strip() == \
        "stream audit deleted"
    assert "audit" not in jetstream(brokers, "stream", "list").stdout


def test_stream_commands_json(broker: BrokerProcess) -> None:
    brokers = broker.address
    created = json_of(brokers, "stream", "create", "clicks", "--subject", "clicks.>",
                      "--label", "app=web", "--fsync", "never", "--max-message-bytes", "4096")
    assert (created["name"], created["subject"], created["labels"]) == (
        "clicks", "clicks.>", {"app": "web"})
    assert (created["fsync"], created["max_message_bytes"]) == ("never", 4096)
    # The same config again is a no-op; the selector filters by labels.
    assert json_of(brokers, "stream", "create", "clicks", "--subject", "clicks.>", "--label",
                   "app=web", "--fsync", "never", "--max-message-bytes", "4096") == created
    assert [s["name"] for s in json_of(brokers, "stream", "list")["streams"]] == ["clicks"]
    assert json_of(brokers, "stream", "list", "--selector", "app!=web") == {"streams": []}

    info = json_of(brokers, "stream", "info", "clicks")
    (partition,) = info["partitions"]
    assert (partition["leader"], partition["isr"], partition["high_watermark"]) == (0, [0], 0)
    # --json before the command works too
    assert jetstream(brokers, "--json", "stream", "delete", "clicks").stdout.strip() == \
        '{"deleted": "clicks"}'
    assert json_of(brokers, "stream", "list") == {"streams": []}


def test_ingest_group_flag_and_its_deprecated_spelling(broker: BrokerProcess) -> None:
    brokers = broker.address
    first = json_of(brokers, "stream", "create", "lb-1", "--subject", "lb", "--ingest-group",
                    "workers")
    old = jetstream(brokers, "stream", "create", "lb-2", "--subject", "lb", "--group", "workers",
                    "--json")
    assert "--group is deprecated" in old.stderr
    assert first["ingest_group"] == json.loads(old.stdout)["ingest_group"] == "workers"
    listed = jetstream(brokers, "stream", "list").stdout
    assert "INGEST_GROUP" in listed and listed.count("workers") == 2


def test_consumer_group_commands(broker: BrokerProcess) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "tasks", "--subject", "tasks")
    jetstream(brokers, "pub", "tasks", "task {i}", "--count", "5")
    first = json_lines(brokers, "sub", "tasks", "--group", "crew", "--max", "3", "--format",
                       "json")
    assert [m["value"] for m in first] == ["task 1", "task 2", "task 3"]
    # the member committed what it printed: the next one resumes after it
    rest = jetstream(brokers, "sub", "tasks", "--group", "crew", "--max", "2").stdout
    assert rest.splitlines()[0].startswith("tasks/0  3  ") and "task 5" in rest

    listed = json_of(brokers, "groups", "list")["groups"]
    assert [(g["group"], g["state"], g["members"]) for g in listed] == [("crew", "empty", 0)]
    described = json_of(brokers, "groups", "describe", "crew")
    (offset,) = described["offsets"]
    assert (offset["offset"], offset["high_watermark"], offset["lag"]) == (5, 5, 0)
    human = jetstream(brokers, "groups", "describe", "crew").stdout
    assert "state               empty" in human and "COMMITTED" in human

    reset = json_of(brokers, "offsets", "reset", "crew", "tasks", "--to", "earliest")
    assert reset["offsets"] == {"0": 0}
    assert json_of(brokers, "groups", "describe", "crew")["offsets"][0]["lag"] == 5
    jetstream(brokers, "offsets", "reset", "crew", "tasks", "--to", "-1h")
    assert json_of(brokers, "offsets", "delete", "crew")["deleted_offsets"] == 1
    assert json_of(brokers, "groups", "describe", "crew")["offsets"] == []

    assert "__offsets" not in jetstream(brokers, "stream", "list").stdout
    assert "__offsets" in jetstream(brokers, "stream", "list", "--all").stdout
    refused = jetstream(brokers, "stream", "delete", "__offsets", ok=False)
    assert refused.returncode == 1 and "STREAM_PROTECTED" in refused.stderr


# -- pub and sub -------------------------------------------------------------------------------


def test_pub_then_sub_reads_it_back_in_both_formats(broker: BrokerProcess,
                                                   tmp_path: Path) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "orders", "--subject", "orders.*")
    out = jetstream(brokers, "pub", "orders.new", "hello", "--key", "k1", "--header",
                    "source=cli").stdout
    assert out.strip() == "acked: stream orders, partition 0, offset 0"
    assert json_of(brokers, "pub", "orders.new", "two\nlines") == {
        "stream": "orders", "partition": 0, "offset": 1, "subject": "orders.new",
        "ack_policy": "all"}
    binary = tmp_path / "blob"
    binary.write_bytes(b"\x00\xff\x10")
    jetstream(brokers, "pub", "orders.bin", "--file", str(binary))
    jetstream(brokers, "pub", "orders.stdin", "-", stdin=b"from stdin")

    lines = jetstream(brokers, "sub", "orders").stdout.splitlines()
    fields = [line.split("  ") for line in lines]
    assert [(f[0], f[2], f[3]) for f in fields] == [
        ("0", "k1", "hello"), ("1", "-", "two\\nlines"), ("2", "-", "base64:AP8Q"),
        ("3", "-", "from stdin")]
    assert all(f[1].endswith("Z") for f in fields)

    messages = json_lines(brokers, "sub", "orders", "--format", "json")
    assert [m["offset"] for m in messages] == [0, 1, 2, 3]
    first, second, third, fourth = messages
    assert (first["key"], first["value"], first["headers"], first["subject"]) == (
        "k1", "hello", {"source": "cli"}, "orders.new")
    assert (second["key"], second["value"]) == (None, "two\nlines")
    assert base64.b64decode(third["value_base64"]) == b"\x00\xff\x10"
    assert "value" not in third and fourth["value"] == "from stdin"
    assert abs(first["timestamp_ms"] - time.time() * 1000) < 60_000
    # --json is the same as --format json
    assert json_lines(brokers, "sub", "orders", "--json", "--max", "1") == messages[:1]


def test_sub_from_each_form(broker: BrokerProcess) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "ticks", "--subject", "ticks")
    jetstream(brokers, "pub", "ticks", "old {i}", "--count", "3")
    # Millisecond timestamps: let the clock move past the old messages' before marking `now`.
    old_ms = json_lines(brokers, "sub", "ticks", "--from", "latest", "--json")[0]["timestamp_ms"]
    while int(time.time() * 1000) <= old_ms + 1:
        time.sleep(0.002)
    now = datetime.now(UTC)
    jetstream(brokers, "pub", "ticks", "new {i}", "--count", "2")

    def values(*args: str) -> list[str]:
        return [m["value"] for m in json_lines(brokers, "sub", "ticks", "--json", *args)]

    everything = ["old 1", "old 2", "old 3", "new 1", "new 2"]
    assert values() == everything
    assert values("--from", "earliest") == everything
    assert values("--from", "latest") == ["new 2"]
    assert values("--from", "new") == []
    assert values("--from", "3") == ["new 1", "new 2"]
    assert values("--from", now.isoformat()) == ["new 1", "new 2"]
    assert values("--from", now.isoformat(timespec="milliseconds").replace("+00:00", "Z")) \
        == ["new 1", "new 2"]
    assert values("--from", "-5m") == everything
    assert values("--from=-1h30m") == everything
    assert values("--from", "2000-01-01") == everything
    assert values("--from", "1", "--max", "2") == ["old 2", "old 3"]

    bad = jetstream(brokers, "sub", "ticks", "--from", "yesterday", ok=False)
    assert bad.returncode == 2 and "--from 'yesterday'" in bad.stderr
    assert values("--from", "99") == []  # past the end: caught up at once
    beyond = jetstream(brokers, "sub", "ticks", "--from", "99", "--follow", ok=False)
    assert beyond.returncode == 1 and "error [OFFSET_OUT_OF_RANGE]" in beyond.stderr


def test_sub_follow_receives_a_message_published_after_it_started(
        broker: BrokerProcess, procs: Procs) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "chat", "--subject", "chat.*")
    jetstream(brokers, "pub", "chat.room", "before")
    follower = procs.start(brokers, "sub", "chat", "--follow")
    lines = Lines(follower)
    assert lines.next().endswith("  -  before")  # running and caught up

    jetstream(brokers, "pub", "chat.room", "after", "--key", "bob")

    assert lines.next().endswith("  bob  after")
    os.kill(follower.pid, signal.SIGINT)  # Ctrl-C
    assert follower.wait(EXIT_TIMEOUT_S) == 0


def test_pub_count_1000_then_sub_counts_1000(broker: BrokerProcess) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "load", "--subject", "load")
    summary = json_of(brokers, "pub", "load", "message {i}", "--count", "1000")
    assert (summary["count"], summary["acked"], summary["msgs_per_s"] > 0) == (1000, 1000, True)
    assert summary["partitions"] == [{"stream": "load", "partition": 0, "first_offset": 0,
                                      "last_offset": 999, "count": 1000}]
    human = jetstream(brokers, "pub", "load", "more", "--count", "10").stdout
    assert human.startswith("published 10 messages to load in ") and "msgs/s" in human
    assert "load/0  offsets 1000..1009" in human

    messages = json_lines(brokers, "sub", "load", "--format", "json", "--max", "1000")
    assert [m["offset"] for m in messages] == list(range(1000))
    assert [m["value"] for m in messages[:2]] == ["message 1", "message 2"]
    assert messages[-1]["value"] == "message 1000"
    assert len(jetstream(brokers, "sub", "load").stdout.splitlines()) == 1010


def test_cluster_status(broker: BrokerProcess) -> None:
    brokers = broker.address
    jetstream(brokers, "stream", "create", "parts", "--subject", "parts", "--partitions", "2")
    jetstream(brokers, "pub", "parts", "x", "--partition", "1")
    status = json_of(brokers, "cluster", "status")
    assert [(b["address"], b["nats_url"], b["nats_state"], b["disk_full"])
            for b in status["brokers"]] == [(broker.address, broker.nats_url, "connected", False)]
    used = status["brokers"][0]["disk_used_percent"]
    assert 0 < used < 100
    own = status["brokers"][0]
    assert 0 < own["open_files"] <= own["open_files_max"] <= own["open_files_limit"] // 2
    assert [(p["stream"], p["partition"], p["leader"], p["isr"], p["leader_epoch"],
             p["high_watermark"], p["log_end_offset"]) for p in status["partitions"]] == [
        ("parts", 0, 0, [0], 0, 0, 0), ("parts", 1, 0, [0], 0, 1, 1)]
    human = jetstream(brokers, "cluster", "status").stdout
    row = next(line.split() for line in human.splitlines() if line.startswith("0 "))
    assert row[:5] == ["0", broker.address, str(broker.http_port), broker.nats_url, "connected"]
    assert row[5].endswith("%") and 0 < float(row[5][:-1]) < 100 and row[6] == "no"
    opened, most = row[7].split("/")  # the count may have moved since the JSON call
    assert 0 < int(opened) <= int(most) == own["open_files_max"]
    assert ["parts", "1", "0", "0", "0", "0", "1", "1"] in [
        line.split() for line in human.splitlines()]


# -- errors ------------------------------------------------------------------------------------


def test_errors_have_codes_and_exit_statuses(broker: BrokerProcess) -> None:
    brokers = broker.address
    for args in (["stream", "info", "nope"], ["stream", "delete", "nope"], ["sub", "nope"]):
        result = jetstream(brokers, *args, ok=False)
        assert result.returncode == 1, args
        assert result.stderr.startswith("error [UNKNOWN_STREAM]: unknown stream 'nope'"), args

    bad_name = jetstream(brokers, "stream", "create", "bad name", "--subject", "x", ok=False)
    assert bad_name.returncode == 1
    assert bad_name.stderr.startswith("error [INVALID_STREAM_CONFIG]")
    nobody = jetstream(brokers, "pub", "nobody.listens", "x", ok=False)
    assert (nobody.returncode, nobody.stderr.split(":")[0]) == (1, "error [NO_STREAM_FOR_SUBJECT]")
    bad_label = jetstream(brokers, "stream", "create", "s", "--subject", "s", "--label", "x",
                          ok=False)
    assert bad_label.returncode == 2 and "expected KEY=VALUE" in bad_label.stderr
    unreachable = jetstream("127.0.0.1:1", "stream", "list", ok=False)
    assert unreachable.returncode == 1 and "error [BROKER_UNAVAILABLE]" in unreachable.stderr


def test_missing_brokers_is_a_usage_error() -> None:
    result = jetstream(None, "stream", "list", ok=False)
    assert result.returncode == 2
    assert "no brokers: pass --brokers HOST:PORT,... or set JETSTREAM_BROKERS" in result.stderr
    assert jetstream(None, "pub", "--brokers", "nonsense", "s", "x", ok=False).returncode == 2
    assert jetstream(None, "stream", ok=False).returncode == 2  # no subcommand


# -- jetstream dev -----------------------------------------------------------------------------


def test_dev_serves_clients_and_stops_cleanly_on_sigint(procs: Procs, tmp_path: Path) -> None:
    dev = procs.start(None, "dev", "--json", stderr_path=tmp_path / "dev.err")
    ready = json.loads(Lines(dev).next(DEV_READY_TIMEOUT_S))
    assert ready["event"] == "ready" and ready["pid"] == dev.pid
    nats_pids = [pid for pid in _children(dev.pid) if _is_nats_server(pid)]
    procs.extra_pids += nats_pids
    assert len(nats_pids) == 1, "the embedded nats-server is a child of `jetstream dev`"

    brokers = ready["brokers"]
    assert len(brokers.split(",")) == 3  # a local 3-broker cluster
    jetstream(brokers, "stream", "create", "orders", "--subject", "orders.*")
    assert json_of(brokers, "pub", "orders.new", "hello")["offset"] == 0
    assert [m["value"] for m in json_lines(brokers, "sub", "orders", "--json")] == ["hello"]

    os.kill(dev.pid, signal.SIGINT)
    assert dev.wait(EXIT_TIMEOUT_S) == 0, (tmp_path / "dev.err").read_text()
    assert _wait_gone(nats_pids[0], EXIT_TIMEOUT_S), "nats-server outlived `jetstream dev`"
    assert not Path(ready["data_dir"]).exists()  # the temporary data dir is removed
