"""Every setting of a broker, with its default and its unit, in one place.

A setting comes from, in rising precedence: its default here, a TOML config file
(`jetstream server --config FILE`; keys are the field names), `JETSTREAM_<FIELD>` environment
variables, then command-line flags (`--field-name`). Values are checked once, here.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from jetstream.errors import InvalidConfig
from jetstream.security.tls import TLS_VERSIONS, TlsFiles
from jetstream.stream.config import MiB

ENV_PREFIX = "JETSTREAM_"
#: The smallest open_files_max that may be set (0 sizes it from the open-file limit).
OPEN_FILES_MIN = 16


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    #: Unique id of this broker in its cluster.
    broker_id: int = 0
    #: Where partitions, metadata and checkpoints live.
    data_dir: str = "./jetstream-data"
    #: Address of the socket API (and of the HTTP API). Loopback unless you mean otherwise.
    host: str = "127.0.0.1"
    #: Socket API port; 0 picks a free one (printed at start).
    port: int = 0
    #: HTTP API port; 0 picks a free one, -1 turns the HTTP API off.
    http_port: int = 0
    #: NATS server URLs, comma-separated. Empty: start an embedded nats-server on loopback.
    nats_url: str = ""
    #: Client port of the embedded nats-server; 0 picks a free one.
    nats_port: int = 0
    #: NATS client for ingest and acks: "fast" (a bulk protocol parser; falls back to nats-py
    #: for TLS) or "nats-py".
    nats_client: str = "fast"
    #: Most client connections the socket API accepts at once.
    connections_max: int = 1024
    #: Largest request frame a client may send.
    request_bytes_max: int = 1 * MiB
    #: Cap on a Fetch's max_bytes and max_wait_ms.
    fetch_bytes_max: int = 16 * MiB
    fetch_wait_ms_max: int = 60_000
    #: Requests one connection may have in flight (pipelined) before the broker stops reading.
    connection_requests_max: int = 256
    #: Messages one partition's NATS subscription may buffer before NATS drops (slow consumer).
    ingest_pending_msgs_max: int = 512 * 1024
    ingest_pending_bytes_max: int = 256 * MiB
    #: Most messages and bytes appended as one batch.
    ingest_batch_records_max: int = 16_384
    ingest_batch_bytes_max: int = 8 * MiB
    #: Appended batches waiting for fsync/commit before ingest pauses.
    ingest_inflight_batches_max: int = 64
    #: Per partition leader: message ids remembered within the duplicate window, idempotent
    #: producers, sequences remembered per producer, keys tracked for key expectations
    #: (compacted streams). Past each, the oldest are forgotten first.
    dedupe_ids_max: int = 1_000_000
    dedupe_producers_max: int = 10_000
    dedupe_sequences_max: int = 1_000
    expectation_keys_max: int = 1_000_000
    #: Log cleaner (compacted streams): passes running at once (threads), the memory of one
    #: pass's offset map, and how long the cleaner sleeps when no partition is due.
    cleaner_threads: int = 1
    cleaner_buffer_bytes: int = 128 * MiB
    cleaner_backoff_ms: int = 15_000
    #: Key indexes of compacted partitions: how often they catch up with the high watermark
    #: (a read waiting for an offset wakes them at once), and each one's size limit.
    key_index_interval_ms: int = 100
    key_index_bytes_max: int = 1024 * MiB
    #: Committed offsets (`__offsets`, created on first use): its partitions and replication
    #: factor (capped at the cluster's size; min ISR 2 when it has 3), and how long an empty
    #: consumer group's offsets are kept after its last commit.
    offsets_partitions: int = 16
    offsets_replication_factor: int = 3
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_ms: int = 60_000
    #: Consumer groups: the bounds a member's session timeout is held to, the heartbeat
    #: interval members are told (at most a third of their session), the most members of one
    #: group and the most groups this broker coordinates.
    group_session_timeout_ms_min: int = 1_000
    group_session_timeout_ms_max: int = 300_000
    group_heartbeat_interval_ms: int = 1_000
    group_members_max: int = 1_000
    groups_max: int = 100_000
    #: How often this broker's coordinators expire members whose sessions ended.
    group_expiry_check_ms: int = 100
    #: How often retention runs and the high watermark is checkpointed.
    retention_check_ms: int = 30_000
    checkpoint_interval_ms: int = 5_000
    #: Room kept free in the data directory (a preallocated file) for the metadata writes
    #: that get a full disk back into use, such as deleting a stream; 0: none.
    disk_reserve_bytes: int = 4 << 20
    #: Above this share of the data disk in use, appends are refused (DISK_FULL), so the
    #: broker keeps room to recover and delete; checked every `disk_check_ms`.
    disk_high_watermark_percent: int = 95
    disk_check_ms: int = 1_000
    #: The scrubber re-reads every replica held here at this rate (checking each batch's CRC
    #: and each segment's indexes), a first pass at start, then one every
    #: `scrub_interval_ms`. 0: no background scrub (reads and `jetstream scrub` still check).
    scrub_bytes_per_s: int = 4 * MiB
    scrub_interval_ms: int = 6 * 3_600_000
    #: Most descriptors of partition files (segments, key indexes) held open at once; the
    #: least recently used are closed, active segments last. 0: half the open-file limit,
    #: which the broker raises to its hard limit at start (jetstream.server.files).
    open_files_max: int = 0
    #: A turn of the event loop that has at least this many logs to make durable (a fetch
    #: answer for many followers, publishes to many streams, under `fsync=always`; or
    #: `interval` fsyncs that came due together) makes them durable with one syncfs(2) of
    #: the data directory's filesystem instead of an fsync each (jetstream.stream.fs_sync;
    #: Linux 5.8 or later, else an fsync each). 0: an fsync each always (a data directory
    #: on a filesystem other programs keep busy).
    fsync_group_min: int = 4
    #: Every broker's metadata Raft address, "id@host:raftport,..." (this one's included).
    #: Empty: a single broker with local metadata.
    cluster: str = ""
    #: Where to dial another broker when a relay sits in between, "id@host:port,...": its
    #: metadata Raft port (`raft_routes`) and its socket API (`peer_routes`, replication and
    #: failure reports). Brokers not named are dialled at their own addresses.
    raft_routes: str = ""
    peer_routes: str = ""
    #: Password of the metadata Raft group (encrypts and authenticates it); empty: none.
    #: `raft_password_file` reads it from a file instead (its first line), which keeps it
    #: out of the process list and the environment.
    raft_password: str = ""
    raft_password_file: str = ""
    #: A follower that has not caught up for this long leaves the ISR.
    replica_lag_ms_max: int = 10_000
    #: A follower that got no answer from its leader for this long reports it.
    replica_leader_timeout_ms: int = 1_500
    #: Long-poll wait and size of one follower fetch.
    replica_fetch_wait_ms: int = 500
    #: How long a leader holds a new HW with nothing else to send a waiting follower fetch,
    #: for records to carry it (at a steady rate a commit then costs one round trip).
    replica_fetch_hw_delay_ms: int = 5
    replica_fetch_bytes_max: int = 4 * MiB
    #: A broker whose metadata connection is down this long is taken as gone (failover).
    broker_timeout_ms: int = 3_000
    #: A stopping broker, once marked shutting down, waits at most this long for every other
    #: live broker to be marked too before it hands its leaderships over (brokers stopped
    #: together then keep theirs; one stopping alone waits this long).
    controlled_shutdown_wait_ms: int = 300
    #: Preferred-leader rebalancing (jetstream.raft_meta.rebalance): every this often the
    #: metadata leader gives each broker whose preferred partitions (first replica) are led
    #: elsewhere above `leader_imbalance_per_broker_percentage` those leaderships back,
    #: where it is live and in the ISR. Kafka's auto.leader.rebalance.enable and its two
    #: settings; `auto_leader_rebalance` false turns it off.
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_ms: int = 300_000
    leader_imbalance_per_broker_percentage: int = 10
    #: TLS of the socket API (clients, and replication between brokers): this broker's
    #: certificate chain and key (PEM files, the key unencrypted), and the CA bundle that
    #: verifies the brokers it dials and, with `tls_verify_client`, every client it accepts
    #: (mutual TLS: a client without a certificate of that CA is refused). Empty `tls_cert`:
    #: plain TCP. The broker presents the same certificate when it dials another broker.
    #: Files are read again on SIGHUP (new connections use them; open ones carry on).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_verify_client: bool = False
    #: The lowest TLS version accepted or spoken on every link: "1.2" or "1.3".
    tls_min_version: str = "1.2"
    #: TLS of the HTTP API; each empty one is the socket API's (`tls_cert`, ...), so setting
    #: `tls_cert`/`tls_key` puts both listeners on TLS. Mutual TLS is chosen per listener.
    http_tls_cert: str = ""
    http_tls_key: str = ""
    http_tls_ca: str = ""
    http_tls_verify_client: bool = False
    #: The broker's NATS connections: a CA bundle for a nats-server with TLS (or `tls://`
    #: URLs), a client certificate and key when that server verifies clients, and the
    #: credentials it asks for: a user and password, a token, or a creds file (JWT + nkey).
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    nats_user: str = ""
    nats_password: str = ""
    nats_token: str = ""
    nats_creds: str = ""
    #: Start even though a listener binds off loopback without its protection (see the
    #: README's "Security"): logged as an error at start and shown in `GET /health`.
    insecure: bool = False
    #: A connection that has begun a request frame and sent none of the rest of it for this
    #: long is closed (slow or stalled senders hold no memory for ever).
    request_timeout_ms: int = 30_000
    #: A TLS handshake not finished within this is closed.
    tls_handshake_timeout_ms: int = 10_000
    #: Most connections the HTTP API serves at once; past it, 503 answers.
    http_connections_max: int = 1024
    #: Tiered storage (streams with a `fragment_store`): bytes of downloaded fragments kept
    #: in `<data_dir>/fragment-cache`, how often a leader lists its partition's fragments,
    #: and the longest backoff between offload passes while the store fails.
    fragment_cache_bytes_max: int = 1024 * MiB
    fragment_list_interval_ms: int = 60_000
    fragment_backoff_ms_max: int = 30_000
    #: Authentication of the socket and HTTP APIs: every connection and HTTP request must
    #: prove a principal (a client certificate's CN with `tls_verify_client`, or a user's
    #: password checked against its argon2id hash). `users`: "name:hash" entries separated
    #: by white space or ';'; `users_file`: one "name:hash" a line (`jetstream user hash`
    #: prints a hash). In a cluster brokers authenticate to each other with a token derived
    #: from the metadata Raft password, which authentication therefore needs there.
    authentication: bool = False
    users: str = ""
    users_file: str = ""
    #: Authorization: every request needs an ACL entry allowing it (default deny; the ACLs
    #: live in the replicated metadata, `jetstream acl`); `super_users` (comma-separated
    #: principals) may do anything. Needs `authentication`.
    authorization: bool = False
    super_users: str = ""
    #: Requests one principal may have in flight on this broker at once (socket and HTTP
    #: APIs, every connection of it together); past it, TOO_MANY_IN_FLIGHT. Brokers have no
    #: limit.
    principal_requests_max: int = 4096

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidConfig(f"{f.name} must be an integer, got {value!r}", field=f.name)
            if f.type == "str" and not isinstance(value, str):
                raise InvalidConfig(f"{f.name} must be a string, got {value!r}", field=f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise InvalidConfig(f"{f.name} must be true or false, got {value!r}",
                                    field=f.name)
        _range(self, "broker_id", 0, 2**31 - 1)
        _range(self, "port", 0, 65535)
        _range(self, "http_port", -1, 65535)
        _range(self, "nats_port", 0, 65535)
        _range(self, "connections_max", 1, 1_000_000)
        _range(self, "request_bytes_max", 4096, 64 * MiB)
        _range(self, "fetch_bytes_max", 1024, 256 * MiB)
        _range(self, "fetch_wait_ms_max", 0, 3_600_000)
        _range(self, "connection_requests_max", 1, 65536)
        _range(self, "ingest_pending_msgs_max", 1, 100_000_000)
        _range(self, "ingest_pending_bytes_max", 1024, 64 * 1024 * MiB)
        _range(self, "ingest_batch_records_max", 1, 1_000_000)
        _range(self, "ingest_batch_bytes_max", 1024, 512 * MiB)
        _range(self, "ingest_inflight_batches_max", 1, 100_000)
        _range(self, "dedupe_ids_max", 1, 100_000_000)
        _range(self, "dedupe_producers_max", 1, 10_000_000)
        _range(self, "dedupe_sequences_max", 1, 1_000_000)
        _range(self, "expectation_keys_max", 1, 100_000_000)
        _range(self, "retention_check_ms", 10, 86_400_000)
        _range(self, "disk_reserve_bytes", 0, 1 << 30)
        _range(self, "disk_high_watermark_percent", 1, 100)
        _range(self, "disk_check_ms", 10, 60_000)
        _range(self, "scrub_bytes_per_s", 0, 64 * 1024 * MiB)
        _range(self, "scrub_interval_ms", 1_000, 30 * 24 * 3_600_000)
        _range(self, "cleaner_threads", 1, 64)
        _range(self, "cleaner_buffer_bytes", 64 * 1024, 64 * 1024 * MiB)
        _range(self, "cleaner_backoff_ms", 10, 86_400_000)
        _range(self, "key_index_interval_ms", 1, 3_600_000)
        _range(self, "key_index_bytes_max", 1 * MiB, 1024 * 1024 * MiB)
        _range(self, "checkpoint_interval_ms", 10, 86_400_000)
        _range(self, "offsets_partitions", 1, 1024)
        _range(self, "offsets_replication_factor", 1, 7)
        _range(self, "offsets_retention_ms", 1000, 10 * 365 * 86_400_000)
        _range(self, "offsets_retention_check_ms", 10, 86_400_000)
        _range(self, "group_session_timeout_ms_min", 100, 3_600_000)
        _range(self, "group_session_timeout_ms_max", self.group_session_timeout_ms_min,
               3_600_000)
        _range(self, "group_heartbeat_interval_ms", 10, 3_600_000)
        _range(self, "group_members_max", 1, 100_000)
        _range(self, "groups_max", 1, 10_000_000)
        _range(self, "group_expiry_check_ms", 10, 60_000)
        if self.open_files_max != 0 and not OPEN_FILES_MIN <= self.open_files_max <= 1 << 20:
            raise InvalidConfig(f"open_files_max must be 0 (0 sizes it from the open-file "
                                f"limit) or in [{OPEN_FILES_MIN}, {1 << 20}], got "
                                f"{self.open_files_max}", field="open_files_max")
        _range(self, "fsync_group_min", 0, 1_000_000)
        _range(self, "replica_lag_ms_max", 10, 3_600_000)
        _range(self, "replica_leader_timeout_ms", 10, 3_600_000)
        _range(self, "replica_fetch_wait_ms", 0, 60_000)
        _range(self, "replica_fetch_hw_delay_ms", 0, 1_000)
        _range(self, "replica_fetch_bytes_max", 1024, 256 * MiB)
        _range(self, "broker_timeout_ms", 10, 3_600_000)
        _range(self, "controlled_shutdown_wait_ms", 0, 60_000)
        _range(self, "leader_imbalance_check_interval_ms", 100, 86_400_000)
        _range(self, "leader_imbalance_per_broker_percentage", 0, 100)
        _range(self, "fragment_cache_bytes_max", 1 * MiB, 1024 * 1024 * MiB)
        _range(self, "fragment_list_interval_ms", 100, 86_400_000)
        _range(self, "fragment_backoff_ms_max", 100, 3_600_000)
        members = self.cluster_members  # parses and checks `cluster`
        if members and self.broker_id not in members:
            raise InvalidConfig(f"cluster does not name this broker ({self.broker_id})",
                                field="cluster")
        for name in ("raft_routes", "peer_routes"):
            unknown = sorted(set(_addresses(self, name)) - set(members))
            if unknown:
                raise InvalidConfig(f"{name} names brokers not in the cluster: {unknown}",
                                    field=name)
        if self.nats_client not in ("fast", "nats-py"):
            raise InvalidConfig(f"nats_client must be 'fast' or 'nats-py', got "
                                f"{self.nats_client!r}", field="nats_client")
        if not self.data_dir:
            raise InvalidConfig("data_dir must not be empty", field="data_dir")
        _range(self, "request_timeout_ms", 100, 3_600_000)
        _range(self, "tls_handshake_timeout_ms", 100, 600_000)
        _range(self, "http_connections_max", 1, 1_000_000)
        check_tls_settings(self)
        check_auth_settings(self)

    @property
    def cluster_members(self) -> dict[int, str]:
        """Broker id -> metadata Raft address ("host:port"), from `cluster`."""
        return _addresses(self, "cluster")

    @property
    def raft_route_map(self) -> dict[str, str]:
        """A partner's metadata Raft address -> where to dial it, from `raft_routes`."""
        members = self.cluster_members
        return {members[bid]: dial for bid, dial in _addresses(self, "raft_routes").items()}

    @property
    def peer_route_map(self) -> dict[int, str]:
        """Broker id -> where to dial its socket API, from `peer_routes`."""
        return _addresses(self, "peer_routes")

    @property
    def nats_urls(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]

    @property
    def metadata_password(self) -> str:
        """`raft_password`, or the first line of `raft_password_file`; empty: none."""
        if not self.raft_password_file:
            return self.raft_password
        try:
            with open(self.raft_password_file, encoding="utf-8") as f:
                password = f.readline().strip()
        except OSError as exc:
            raise InvalidConfig(f"cannot read raft_password_file {self.raft_password_file}: "
                                f"{exc.strerror or exc}", field="raft_password_file") from None
        if not password:
            raise InvalidConfig(f"raft_password_file {self.raft_password_file} is empty",
                                field="raft_password_file")
        return password

    @property
    def super_user_set(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.super_users.split(",") if u.strip())

    @property
    def socket_tls(self) -> TlsFiles | None:
        """The socket API's TLS files, None for plain TCP."""
        if not self.tls_cert:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, self.tls_verify_client,
                        self.tls_min_version)

    @property
    def http_tls(self) -> TlsFiles | None:
        """The HTTP API's TLS files (each unset one is the socket API's), None for plain."""
        cert = self.http_tls_cert or self.tls_cert
        if not cert:
            return None
        return TlsFiles(cert, self.http_tls_key or self.tls_key,
                        self.http_tls_ca or self.tls_ca, self.http_tls_verify_client,
                        self.tls_min_version, "http_tls" if self.http_tls_cert else "tls")

    @property
    def peer_tls(self) -> TlsFiles | None:
        """What this broker dials other brokers' socket APIs with: their CA, its own
        certificate (for brokers that verify clients); None when the socket API is plain."""
        if not self.tls_cert:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, False, self.tls_min_version)

    @property
    def nats_tls(self) -> TlsFiles | None:
        """The NATS connections' TLS: None unless a CA, a client certificate or a tls://
        URL asks for it (then the system's CAs verify the server when no CA is given)."""
        if not (self.nats_tls_ca or self.nats_tls_cert
                or any(u.startswith("tls://") for u in self.nats_urls)):
            return None
        return TlsFiles(self.nats_tls_cert, self.nats_tls_key, self.nats_tls_ca, False,
                        self.tls_min_version, "nats_tls")

    @classmethod
    def load(cls, file: str | Path | None = None, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
        """Defaults < file < environment < overrides (flags). Unknown keys are errors."""
        values: dict[str, Any] = {}
        if file is not None:
            try:
                with open(file, "rb") as f:
                    values.update(_known(tomllib.load(f), f"config file {file}"))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise InvalidConfig(f"cannot read config file {file}: {exc}",
                                    field="config") from None
        types = {f.name: f.type for f in fields(cls)}
        for key, raw in (os.environ if env is None else env).items():
            if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "BROKERS":
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name not in types:
                continue  # other tools share the prefix (JETSTREAM_BROKERS for the CLI)
            values[name] = _parse_env(name, raw, types[name])
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls(**_known(values, "settings"))


def _known(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    names = {f.name for f in fields(BrokerConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InvalidConfig(f"unknown keys in {where}: {unknown}", field=unknown[0])
    return dict(values)


def _parse_env(name: str, raw: str, type_name: object) -> int | str | bool:
    """An environment value as its field's type (`type_name`: the annotation, a string)."""
    if type_name == "bool":
        return parse_bool(raw, f"{ENV_PREFIX}{name.upper()}", name)
    if type_name == "int":
        try:
            return int(raw)
        except ValueError:
            raise InvalidConfig(f"{ENV_PREFIX}{name.upper()} must be an integer, got {raw!r}",
                                field=name) from None
    return raw


def parse_bool(raw: str, where: str, name: str) -> bool:
    """A yes/no setting given as text (environment, flags)."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise InvalidConfig(f"{where} must be true or false, got {raw!r}", field=name)


def check_tls_settings(config: BrokerConfig) -> None:
    """Settings that only make sense together (the files themselves are checked when the
    broker builds its TLS contexts, jetstream.security.tls)."""
    if config.tls_min_version not in TLS_VERSIONS:
        raise InvalidConfig(f"tls_min_version must be one of {sorted(TLS_VERSIONS)}, got "
                            f"{config.tls_min_version!r}", field="tls_min_version")
    pairs = (("tls_cert", "tls_key"), ("http_tls_cert", "http_tls_key"),
             ("nats_tls_cert", "nats_tls_key"))
    for cert, key in pairs:
        if bool(getattr(config, cert)) != bool(getattr(config, key)):
            missing = key if getattr(config, cert) else cert
            raise InvalidConfig(f"{cert} and {key} go together: set {missing} too",
                                field=missing)
    for listener, verify, tls in (("socket API", "tls_verify_client", config.socket_tls),
                                  ("HTTP API", "http_tls_verify_client", config.http_tls)):
        if getattr(config, verify) and (tls is None or not tls.ca):
            raise InvalidConfig(f"{verify} needs TLS on the {listener} and a CA bundle "
                                f"(tls_ca) to verify clients with", field=verify)
    if config.raft_password and config.raft_password_file:
        raise InvalidConfig("set raft_password or raft_password_file, not both",
                            field="raft_password_file")
    if config.nats_token and (config.nats_user or config.nats_creds):
        raise InvalidConfig("nats_token excludes nats_user and nats_creds", field="nats_token")
    if bool(config.nats_user) != bool(config.nats_password):
        raise InvalidConfig("nats_user and nats_password go together",
                            field="nats_password" if config.nats_user else "nats_user")


def _addresses(config: BrokerConfig, name: str) -> dict[int, str]:
    """The "id@host:port,..." setting `name` as broker id -> "host:port"."""
    result: dict[int, str] = {}
    for item in (i.strip() for i in getattr(config, name).split(",")):
        if not item:
            continue
        ident, _, address = item.partition("@")
        host, _, port = address.rpartition(":")
        if not (ident.isdigit() and host and port.isdigit() and 0 < int(port) < 65536):
            raise InvalidConfig(f"{name} entries are id@host:port, got {item!r}", field=name)
        if int(ident) in result:
            raise InvalidConfig(f"{name} names broker {ident} twice", field=name)
        result[int(ident)] = address
    return result


def _range(config: BrokerConfig, name: str, low: int, high: int) -> None:
    value = getattr(config, name)
    if not low <= value <= high:
        raise InvalidConfig(f"{name} must be in [{low}, {high}], got {value}", field=name)


def check_auth_settings(config: BrokerConfig) -> None:
    """Authentication and authorization settings that go together."""
    _range(config, "principal_requests_max", 1, 1_000_000)
    if config.authorization and not config.authentication:
        raise InvalidConfig("authorization needs authentication (principals to authorize)",
                            field="authentication")
    if config.authentication and config.cluster_members and not (
            config.raft_password or config.raft_password_file):
        raise InvalidConfig("authentication in a cluster needs raft_password_file (brokers "
                            "authenticate to each other with a token derived from it)",
                            field="raft_password_file")
    if (config.users or config.users_file) and not config.authentication:
        raise InvalidConfig("users are checked only with authentication on: set "
                            "authentication", field="authentication")
