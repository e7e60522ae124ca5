"""The `jetstream` command line.

`jetstream dev` is the one-command start: an embedded nats-server and a broker on loopback,
stopped by Ctrl-C. `jetstream server` runs one broker from flags, a config file and
`JETSTREAM_*` environment variables. The client commands (`stream`, `pub`, `sub`, `cluster`)
live in jetstream.cli_client.

Exit status: 0 done, 1 an error with a code (printed as `error [CODE]: message`), 2 bad usage,
130 interrupted by Ctrl-C (`dev`, `server` and `sub` stop cleanly on Ctrl-C and exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jetstream.cli_acl import add_auth_flags
from jetstream.cli_client import add_commands
from jetstream.cli_kv import KeyArgumentError
from jetstream.cli_text import UsageError, normalize_argv
from jetstream.errors import JetstreamError

#: Well-known dev ports (copy-paste friendly); any free port when one is taken.
DEV_NATS_PORT = 4222
DEV_BROKERS = 3
DEV_BASE_PORTS = {"port": 7400, "http_port": 7480, "raft": 7500}
#: How long the tasks left after a broker's stop get to end (`_end_leftover_tasks`).
LEFTOVER_TASKS_WAIT_S = 5.0


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _dev_ports() -> tuple[int, list[dict[str, int]]]:
    from jetstream.natsd import free_ports

    def pick(port: int) -> int:
        return port if _free(port) else free_ports(1)[0]

    return pick(DEV_NATS_PORT), [{name: pick(base + i) for name, base in DEV_BASE_PORTS.items()}
                                 for i in range(DEV_BROKERS)]


def _dev(args: argparse.Namespace) -> int:
    """Embedded NATS and a local 3-broker cluster on loopback, until Ctrl-C."""
    import asyncio
    import logging
    import signal

    from jetstream.natsd import NatsServer, ServerTls
    from jetstream.server.broker import Broker
    from jetstream.server.config import BrokerConfig
    from jetstream.server.long_lived import LongLivedObjects

    temporary = args.data_dir is None
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="jetstream-dev-"))
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    nats_port, ports = _dev_ports()
    cluster = ",".join(f"{i}@127.0.0.1:{p['raft']}" for i, p in enumerate(ports))
    tls = _dev_tls(data_dir) if args.tls else {}

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        (data_dir / "nats").mkdir(parents=True, exist_ok=True)
        nats_tls = ServerTls(tls["nats"], tls["nats_key"], tls["ca"], verify=True) if tls \
            else None
        nats_server = await NatsServer(data_dir / "nats", name="dev-nats", port=nats_port,
                                       tls=nats_tls).astart()
        brokers = [Broker(BrokerConfig(
            broker_id=i, data_dir=str(data_dir / f"broker-{i}"), port=p["port"],
            http_port=p["http_port"], nats_url=nats_server.url, cluster=cluster,
            **_dev_broker_tls(tls)))
            for i, p in enumerate(ports)]
        for broker in brokers:  # this process is theirs
            broker.long_lived = LongLivedObjects()
        try:
            _freeze_modules()
            # Together: each waits for a majority of the metadata group before it is ready.
            await asyncio.gather(*(b.start() for b in brokers))
            _freeze_startup_objects()
            _print_dev_ready(args, data_dir, nats_server.url,
                             [b.describe_self() for b in brokers], tls)
            await stop.wait()
        finally:
            # The whole cluster stops: no leadership hand-over between dying brokers.
            await asyncio.gather(*(b.shutdown(hand_over=False) for b in brokers),
                                 return_exceptions=True)
            await nats_server.astop()

    try:
        asyncio.run(run())
    finally:
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)
    if not args.json:
        print("stopped", flush=True)
    return 0


def _dev_tls(data_dir: Path) -> dict[str, str]:
    """A throwaway CA, the brokers' and NATS's certificates, a client's, and a Raft
    password, in <data_dir>/tls (reused when `--data-dir` kept them)."""
    from jetstream.security.certs import ensure_leaves

    loopback = ("127.0.0.1", "localhost")
    return ensure_leaves(data_dir / "tls", [("broker", loopback), ("nats", loopback),
                                             ("client", ("client",))], ["raft-password"])


def _dev_broker_tls(tls: dict[str, str]) -> dict[str, Any]:
    """A dev broker's settings for `_dev_tls`'s files: mutual TLS on its socket and HTTP
    APIs and to NATS, an encrypted metadata Raft group."""
    if not tls:
        return {}
    return {"tls_cert": tls["broker"], "tls_key": tls["broker_key"], "tls_ca": tls["ca"],
            "tls_verify_client": True, "http_tls_verify_client": True,
            "raft_password_file": tls["raft-password"], "nats_tls_ca": tls["ca"],
            "nats_tls_cert": tls["broker"], "nats_tls_key": tls["broker_key"]}


def _print_dev_ready(args: argparse.Namespace, data_dir: Path, nats_url: str,
                     infos: list[dict[str, object]], tls: dict[str, str]) -> None:
    scheme = "jetstreams://" if tls else ""
    addresses = ",".join(f"{scheme}{i['host']}:{i['port']}" for i in infos)
    http = "https" if tls else "http"
    if args.json:
        print(json.dumps({"event": "ready", "brokers": addresses, "nats_url": nats_url,
                          "data_dir": str(data_dir), "pid": os.getpid(),
                          "broker_info": infos, "tls": tls}), flush=True)
        return
    lines = [(f"Jetstream dev: embedded NATS and a {len(infos)}-broker cluster "
             f"(data in {data_dir}{', TLS everywhere' if tls else ''})"),
             f"  NATS          {nats_url}"]
    lines.extend(f"  broker {info['broker_id']}      {info['host']}:{info['port']}   "
                 f"HTTP {http}://{info['host']}:{info['http_port']} (docs: /docs)"
                 for info in infos)
    exports = [f"  export JETSTREAM_BROKERS={addresses}"]
    if tls:
        exports += [f"  export JETSTREAM_CLIENT_TLS_CA={tls['ca']}",
                    f"  export JETSTREAM_CLIENT_TLS_CERT={tls['client']}",
                    f"  export JETSTREAM_CLIENT_TLS_KEY={tls['client_key']}",
                    (f"  # curl --cacert {tls['ca']} --cert {tls['client']} --key "
                     f"{tls['client_key']} https://127.0.0.1:{infos[0]['http_port']}/health")]
    lines += ["", "Try, in another terminal:", *exports,
              "  jetstream stream create orders --subject 'orders.*'",
              "  jetstream pub orders.new 'hello'", "  jetstream sub orders --from earliest",
              "  jetstream cluster status", "", "Ctrl-C stops it."]
    print("\n".join(lines), flush=True)


def _certs(args: argparse.Namespace) -> int:
    """`jetstream certs DIR --leaf broker=broker0,broker1 --secret raft-password`."""
    from jetstream.security.certs import ensure_leaves

    leaves = []
    for item in args.leaf:
        name, sep, hosts = item.partition("=")
        if not sep or not name or not hosts:
            raise UsageError(f"--leaf takes NAME=HOST,..., got {item!r}")
        leaves.append((name, [h.strip() for h in hosts.split(",") if h.strip()]))
    paths = ensure_leaves(Path(args.directory), leaves, args.secret)
    print(json.dumps(paths) if args.json else "\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def _server(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    from dataclasses import fields

    from jetstream.server.broker import Broker
    from jetstream.server.config import BrokerConfig
    from jetstream.server.long_lived import LongLivedObjects

    overrides = {f.name: getattr(args, f.name, None) for f in fields(BrokerConfig)}
    config = BrokerConfig.load(args.config, overrides=overrides)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    broker = Broker(config)
    broker.long_lived = LongLivedObjects()  # this process is the broker's
    _dump_stacks_on_sigusr1()

    async def run() -> None:
        _freeze_modules()
        await broker.start(stop_on_signals=True)
        _freeze_startup_objects()
        info = broker.describe_self()
        if args.json:
            print(json.dumps({"event": "ready", "brokers": f"{info['host']}:{info['port']}",
                              **info}), flush=True)
        else:
            tls = "tls " if info["tls"] else ""
            http = "https" if info["http_tls"] else "http"
            print(f"jetstream broker {info['broker_id']} ready: socket {tls}{info['host']}:"
                  f"{info['port']}  http {http}://{info['host']}:{info['http_port']}  "
                  f"nats {info['nats_url']}", flush=True)
        await broker.run_until_stopped()
        await _end_leftover_tasks()

    asyncio.run(run())
    return 0


async def _end_leftover_tasks() -> None:
    """The broker has stopped: end the tasks still there, each cancelled again until it is
    done. One that is still running after LEFTOVER_TASKS_WAIT_S is logged with its stack,
    and the process exits anyway (its data was closed by the stop)."""
    import io
    import logging

    from jetstream.tasks import cancel_others

    stuck = await cancel_others(LEFTOVER_TASKS_WAIT_S)
    if not stuck:
        return
    log = logging.getLogger("jetstream.cli")
    for task in stuck:
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.error("task %s still runs after the broker stopped:\n%s", task.get_name(),
                  stack.getvalue())
    logging.shutdown()
    os._exit(0)


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's Python stack to stderr (the broker's log): what
    a broker that seems stuck is doing, without stopping it."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _freeze_modules() -> None:
    """Before a broker starts: what the imports allocated (modules, classes, the web
    framework's models) lives as long as the process, so the full collections of the
    start (thousands of roles) need not walk it. Without a collection first: the imports
    leave next to no garbage, and one would cost as much as those it saves. Young
    collections run less often from here on (jetstream.server.long_lived)."""
    import gc

    from jetstream.server.long_lived import tune_young_collections

    gc.freeze()
    tune_young_collections()


def _freeze_startup_objects() -> None:
    """Move what startup allocated (modules, the HTTP app, config, metadata) out of the
    cyclic garbage collector's reach. Those objects live as long as the process; left in
    the oldest generation, every full collection walks them all, which stalled the event
    loop for 60-100 ms at a time under load (records and acks pending for a commit survive
    the young generations and trigger full collections every second or two)."""
    import gc

    gc.collect()
    gc.freeze()


def _add_broker_flags(parser: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from jetstream.server.config import BrokerConfig

    parser.add_argument("--config", help="TOML file of broker settings")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    for f in fields(BrokerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool" and f.default is True:  # on unless --no-<name>
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help="(default on)")
            continue
        if f.type == "bool":  # a switch: present means true (--insecure, --tls-verify-client)
            parser.add_argument(flag, dest=f.name, action="store_true", default=None,
                                help=f"(default {f.default!r})")
            continue
        kind = int if f.type == "int" else str
        parser.add_argument(flag, dest=f.name, type=kind, default=None,
                            help=f"(default {f.default!r})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetstream", description=__doc__.splitlines()[0])
    # Given before or after the command: the command's copies default to SUPPRESS so they do
    # not overwrite a value given before it.
    brokers_help = "brokers to connect to (default: $JETSTREAM_BROKERS)"
    json_help = "print JSON for scripts instead of the human view"
    parser.add_argument("--brokers", metavar="HOST:PORT,...", help=brokers_help)
    parser.add_argument("--json", action="store_true", help=json_help)
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                           help=json_help)
    client_flags = argparse.ArgumentParser(add_help=False, parents=[json_flag])
    client_flags.add_argument("--brokers", metavar="HOST:PORT,...", default=argparse.SUPPRESS,
                              help=brokers_help)
    for name, what in (("ca", "CA bundle that signed the brokers' certificates"),
                       ("cert", "this client's certificate (brokers verifying clients)"),
                       ("key", "this client's private key")):
        client_flags.add_argument(f"--tls-{name}", metavar="PEM", default=argparse.SUPPRESS,
                                  help=f"TLS: {what} (default: $JETSTREAM_CLIENT_TLS_"
                                       f"{name.upper()})")

    add_auth_flags(client_flags)

    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", parents=[json_flag],
                         help="embedded NATS + a local broker, nothing to set up")
    dev.add_argument("--data-dir", help="keep the data here (default: a temp dir, removed)")
    dev.add_argument("--tls", action="store_true",
                     help="secure every link: a throwaway CA in <data-dir>/tls, mutual TLS, "
                          "NATS over TLS, an encrypted metadata Raft group")
    dev.set_defaults(func=_dev)
    certs = sub.add_parser("certs", parents=[json_flag],
                           help="a CA, certificates and secrets for a cluster")
    certs.add_argument("directory", help="where the files go (an existing CA there is reused)")
    certs.add_argument("--leaf", action="append", default=[], metavar="NAME=HOST,...",
                       help="issue NAME.pem/NAME.key for these hosts (kept if they exist)")
    certs.add_argument("--secret", action="append", default=[], metavar="NAME",
                       help="write a random secret to NAME (kept if it exists)")
    certs.set_defaults(func=_certs)
    server = sub.add_parser("server", parents=[json_flag], help="run one broker")
    _add_broker_flags(server)
    server.set_defaults(func=_server)
    add_commands(sub, client_flags)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = normalize_argv(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except JetstreamError as exc:
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 1
    except (UsageError, KeyArgumentError) as exc:
        print(f"{getattr(args, 'prog', 'jetstream')}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`jetstream sub s | head`): not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
