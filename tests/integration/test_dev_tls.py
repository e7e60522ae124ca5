"""`jetstream dev --tls`: a secured local cluster (a throwaway CA, mutual TLS on every
broker listener, NATS over TLS with client certificates, an encrypted metadata Raft group)
that the CLI uses with its TLS flags; and `jetstream certs`, which makes such files."""

from __future__ import annotations

import json
import os
import signal
import ssl
from pathlib import Path

from cryptography import x509

from jetstream.security.tls import client_context
from tests.integration.test_cli import (
    DEV_READY_TIMEOUT_S,
    EXIT_TIMEOUT_S,
    Lines,
    Procs,
    _children,
    _is_nats_server,
    jetstream,
    json_lines,
    procs,  # noqa: F401  (the fixture)
)


def test_dev_tls_runs_a_secured_cluster_the_cli_reaches_with_its_certificate(
        procs: Procs, tmp_path: Path) -> None:  # noqa: F811
    data_dir = tmp_path / "dev"
    dev = procs.start(None, "dev", "--tls", "--json", "--data-dir", str(data_dir),
                      stderr_path=tmp_path / "dev.err")
    ready = json.loads(Lines(dev).next(DEV_READY_TIMEOUT_S))
    # Stopped by PID even if the test fails (it runs in a session of its own).
    procs.extra_pids += [pid for pid in _children(dev.pid) if _is_nats_server(pid)]
    tls = ready["tls"]
    brokers = ready["brokers"]
    assert brokers.startswith("jetstreams://") and ready["nats_url"].startswith("tls://")
    flags = ("--tls-ca", tls["ca"], "--tls-cert", tls["client"], "--tls-key", tls["client_key"])
    jetstream(brokers, "stream", "create", "orders", "--subject", "orders.*", *flags)
    jetstream(brokers, "pub", "orders.new", "hello", *flags)
    assert [m["value"] for m in json_lines(brokers, "sub", "orders", "--json", *flags)] == [
        "hello"]
    refused = jetstream(brokers, "stream", "list", "--tls-ca", tls["ca"], ok=False)
    assert refused.returncode == 1 and "BROKER_UNAVAILABLE" in refused.stderr
    assert (os.stat(tls["raft-password"]).st_mode & 0o077) == 0  # owner-only secret
    with ssl.create_connection(("127.0.0.1", ready["broker_info"][0]["port"])) as raw, \
            client_context(tls["ca"], tls["client"], tls["client_key"]).wrap_socket(
                raw, server_hostname="127.0.0.1") as secured:
        assert secured.version() in ("TLSv1.2", "TLSv1.3")
    os.kill(dev.pid, signal.SIGINT)
    assert dev.wait(EXIT_TIMEOUT_S) == 0, (tmp_path / "dev.err").read_text()


def test_certs_makes_a_ca_leaves_and_secrets_once(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    args = ("certs", str(out), "--leaf", "broker=broker0,broker1,10.0.0.7",
            "--leaf", "client=ops", "--secret", "raft-password", "--json")
    first = json.loads(jetstream(None, *args).stdout)
    again = json.loads(jetstream(None, *args).stdout)
    assert first == again
    ca = Path(first["ca"]).read_bytes()
    assert Path(first["raft-password"]).read_text().strip()
    cert = x509.load_pem_x509_certificate(Path(first["broker"]).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in names] == ["broker0", "broker1", "10.0.0.7"]
    # A leaf added later is signed by the same CA.
    jetstream(None, "certs", str(out), "--leaf", "nats=nats")
    assert Path(first["ca"]).read_bytes() == ca
    context = ssl.create_default_context(cafile=first["ca"])
    assert context.cert_store_stats()["x509_ca"] == 1
    bad = jetstream(None, "certs", str(out), "--leaf", "nohosts", ok=False)
    assert bad.returncode == 2
