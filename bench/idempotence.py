"""What message ids and check-and-set appends cost, side by side with NATS JetStream and NATS KV.

Theory of operation
- One publisher for every ingest side: the compiled load generator (bench/loadgen) sending a
  list of messages on one connection, at most `window` un-acked, 128 B each, with or
  without a `Nats-Msg-Id` header (unique per message), the header a NATS client sets for
  JetStream's dedupe.
- (a) Ours, one broker, a stream with fsync `interval` and ack `leader` (JetStream's
  defaults are the closest), without ids then with ids: `msgid_overhead_ratio` = with ÷
  without (target >= 0.9: ids cost at most 10 %). (b) NATS JetStream R1, file storage, its
  default 2-minute duplicate window, the same messages with ids: `msgid_vs_jetstream` = ours
  with ids ÷ JetStream with ids (target >= 1.0).
- Check-and-set: `writers` (4) coroutines update one key as fast as they can for
  `cas_seconds`, each expecting the key's latest offset (ours: `publish(...,
  expected_last_offset_for_key=)` on a compacted stream; a refusal carries the current
  offset) or revision (NATS KV `update(key, value, last=)`; a refusal is followed by a `get`
  for the current revision, as KV users do). `cas_vs_nats_kv` = our successful updates/s ÷
  NATS KV's (target >= 1.5).
- Generator headroom: the same generator and messages against its compiled no-op responder
  (two hops through nats-server, as our broker's acks take) and as requests nats-server
  answers itself (no one subscribes: "no responders", one hop, as JetStream's acks take),
  the better of the two being what the generator showed it can do; and the same 4-writer
  request loop against a no-op responder on core NATS. Each must reach at least twice the
  best rate measured, or the figures measure the generator.
- Broker and server CPU time per message (/proc) is reported beside the rates. Every side
  runs in fresh server processes in a temp dir on loopback, stopped by PID; figures are
  medians over `repeats` runs.

Run from the repository root: `python -m bench.idempotence [--quick] [--json]`. With --json
the last line is one JSON object; a full run also writes it to bench/results/.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.errors import KeyWrongLastSequenceError

import jetstream
from bench.common import (
    JsonObject,
    Message,
    bench_main,
    cpu_seconds,
    no_op_responder,
)
from bench.loadgen import publish_listed, request_listed, responder
from jetstream.errors import KeyOffsetMismatch
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess

PAYLOAD = b"x" * 128
WRITERS = 4
@dataclass(frozen=True, slots=True)
class Plan:
    messages: int
    window: int
    cas_seconds: float
    repeats: int


QUICK = Plan(messages=30_000, window=2000, cas_seconds=3.0, repeats=1)
FULL = Plan(messages=150_000, window=4000, cas_seconds=10.0, repeats=3)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def messages(subject: str, count: int, ids: bool, run: int) -> list[Message]:
    return [(subject, PAYLOAD, {"Nats-Msg-Id": f"r{run}-{i}"} if ids else None)
            for i in range(count)]


async def timed_publish(url: str, msgs: list[Message], window: int, pid: int, work: Path
                        ) -> JsonObject:
    cpu0 = cpu_seconds(pid)
    run = await publish_listed(url, msgs, window, work)
    run["cpu_us_per_msg"] = (cpu_seconds(pid) - cpu0) / len(msgs) * 1e6
    if run["errors"]:
        raise RuntimeError(f"{run['errors']} publishes were refused")
    return run


def median(runs: Sequence[JsonObject]) -> JsonObject:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]} | {
        "runs": [round(r["puts_per_s"]) for r in runs]}


# -- ingest -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def one_broker(work: Path, name: str, streams: dict[str, dict[str, Any]]
                     ) -> AsyncIterator[tuple[str, BrokerProcess, jetstream.Client]]:
    """(NATS URL, broker, client) of a fresh nats-server and broker holding `streams`
    (name -> settings; subject `<name>.in`), stopped by PID afterwards."""
    with NatsServer(work / f"nats-{name}") as server:
        broker = BrokerProcess(work / f"broker-{name}", server.url,
                               extra_args=("--http-port", "-1")).start()
        try:
            async with jetstream.connect(broker.address) as js:
                for stream, settings in streams.items():
                    await js.create_stream(stream, f"{stream}.in", fsync="interval",
                                           ack_policy="leader", **settings)
                yield server.url, broker, js
        finally:
            broker.stop()


async def ours_ingest(work: Path, plan: Plan) -> JsonObject:
    async with one_broker(work, "ingest", {"plain": {}, "ids": {}}) as (url, broker, _js):
        plain, ids = [], []
        for run in range(plan.repeats):  # interleaved: the machine drifts
            progress(f"ours without ids, run {run + 1}")
            plain.append(await timed_publish(url, messages(
                "plain.in", plan.messages, False, run), plan.window, broker.pid, work))
            progress(f"ours with ids, run {run + 1}")
            ids.append(await timed_publish(url, messages(
                "ids.in", plan.messages, True, run), plan.window, broker.pid, work))
    return {"without_ids": median(plain), "with_ids": median(ids)}


async def jetstream_ingest(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-js", jetstream=True) as server:
        nc = await nats.connect(server.url)
        try:
            await nc.jetstream().add_stream(name="bench", subjects=["js.in"])
        finally:
            await nc.close()
        runs = []
        for run in range(plan.repeats):
            progress(f"NATS JetStream with ids, run {run + 1}")
            runs.append(await timed_publish(server.url, messages(
                "js.in", plan.messages, True, run), plan.window, server.pid, work))
    return median(runs)


# -- check-and-set on one key -------------------------------------------------------------------


async def cas_loop(update: Callable[[int], Awaitable[int]], seconds: float) -> JsonObject:
    """WRITERS coroutines, each `update(i)` until the time is up; update returns 1 for a
    successful write and 0 for a refused one."""
    done = {"ok": 0, "refused": 0}
    stop_at = time.perf_counter() + seconds

    async def writer(w: int) -> None:
        i = 0
        while time.perf_counter() < stop_at:
            if await update(w * 1_000_000 + i):
                done["ok"] += 1
            else:
                done["refused"] += 1
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    elapsed = time.perf_counter() - started
    return {"cas_per_s": done["ok"] / elapsed, "refused_per_s": done["refused"] / elapsed,
            "ok": done["ok"]}


async def ours_cas(work: Path, plan: Plan) -> JsonObject:
    async with one_broker(work, "cas", {"cas": {"cleanup_policy": "compact"}}) as (
            _url, broker, js):
        last = {"offset": -1}

        async def update(i: int) -> int:
            try:
                ack = await js.publish("cas.in", b"%d" % i, key=b"k",
                                       expected_last_offset_for_key=last["offset"])
            except KeyOffsetMismatch as exc:
                last["offset"] = max(last["offset"], exc.last_offset)
                return 0
            assert ack is not None
            last["offset"] = max(last["offset"], ack.offset)
            return 1

        await cas_loop(update, 0.5)  # warm-up: connections, the key's first write
        cpu0 = cpu_seconds(broker.pid)
        result = await cas_loop(update, plan.cas_seconds)
        result["cpu_us_per_cas"] = (cpu_seconds(broker.pid) - cpu0) / max(
            result["ok"], 1) * 1e6
    return result


async def nats_kv_cas(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-kv", jetstream=True) as server:
        nc = await nats.connect(server.url)
        try:
            kv = await nc.jetstream().create_key_value(bucket="cas", history=1)
            last = {"revision": await kv.create("k", b"0")}

            async def update(i: int) -> int:
                try:
                    revision = await kv.update("k", b"%d" % i, last=last["revision"])
                except KeyWrongLastSequenceError:
                    entry = await kv.get("k")
                    assert entry.revision is not None
                    last["revision"] = max(last["revision"], entry.revision)
                    return 0
                last["revision"] = max(last["revision"], revision)
                return 1

            await cas_loop(update, 0.5)
            cpu0 = cpu_seconds(server.pid)
            result = await cas_loop(update, plan.cas_seconds)
            result["cpu_us_per_cas"] = (cpu_seconds(server.pid) - cpu0) / max(
                result["ok"], 1) * 1e6
        finally:
            await nc.close()
    return result


# -- the load generator's ceiling ---------------------------------------------------------------


async def generator_ceiling(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-core") as server:
        with responder(server.url, "fast.x"):
            puts = await publish_listed(server.url, messages("fast.x", plan.messages, True, 0),
                                        plan.window, work)
        answered = await request_listed(server.url, messages("none.x", plan.messages, True, 0),
                                        plan.window, work)
    with NatsServer(work / "nats-core-2") as server, no_op_responder(server.url, "sink.>"):
        nc = await nats.connect(server.url)
        try:
            async def request(i: int) -> int:
                await nc.request("sink.cas", b"%d" % i, timeout=10)
                return 1

            requests = await cas_loop(request, plan.cas_seconds)
        finally:
            await nc.close()
    return {"responder_puts_per_s": puts["puts_per_s"],
            "server_answered_per_s": answered.msgs_per_s,
            "puts_per_s": max(puts["puts_per_s"], answered.msgs_per_s),
            "requests_per_s": requests["cas_per_s"]}


async def run(plan: Plan) -> JsonObject:
    with tempfile.TemporaryDirectory(prefix="bench-idempotence-") as tmp:
        work = Path(tmp)
        ours = await ours_ingest(work, plan)
        peer = await jetstream_ingest(work, plan)
        progress("check-and-set: ours")
        cas = await ours_cas(work, plan)
        progress("check-and-set: NATS KV")
        kv = await nats_kv_cas(work, plan)
        progress("load generator ceiling")
        ceiling = await generator_ceiling(work, plan)
    with_ids = ours["with_ids"]["puts_per_s"]
    best_ingest = max(with_ids, ours["without_ids"]["puts_per_s"], peer["puts_per_s"])
    return {
        "plan": asdict(plan), "ours": ours, "jetstream": peer, "cas_ours": cas,
        "cas_nats_kv": kv, "generator": ceiling,
        "msgid_overhead_ratio": with_ids / ours["without_ids"]["puts_per_s"],
        "msgid_vs_jetstream": with_ids / peer["puts_per_s"],
        "cas_vs_nats_kv": cas["cas_per_s"] / kv["cas_per_s"],
        "generator_put_headroom": ceiling["puts_per_s"] / best_ingest,
        "generator_cas_headroom": ceiling["requests_per_s"] / max(cas["cas_per_s"],
                                                                   kv["cas_per_s"]),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def table(r: JsonObject) -> str:
    o, p = r["ours"], r["jetstream"]
    plain, ids = o["without_ids"], o["with_ids"]
    c, k = r["cas_ours"], r["cas_nats_kv"]
    rows: list[Any] = [
        f"{'':30} {'msgs/s':>10} {'ack p50 ms':>11} {'ack p99 ms':>11} {'CPU us/msg':>11}",
        *(f"{name:30} {s['puts_per_s']:10,.0f} {s['ack_p50_ms']:11.2f} {s['ack_p99_ms']:11.2f} "
          f"{s['cpu_us_per_msg']:11.1f}"
          for name, s in (("ours, no ids", plain), ("ours, Nats-Msg-Id", ids),
                          ("NATS JetStream, Nats-Msg-Id", p))),
        "",
        f"ids cost: with / without = {r['msgid_overhead_ratio']:.2f} (target >= 0.9)",
        f"ours / JetStream, both with ids = {r['msgid_vs_jetstream']:.2f} (target >= 1.0)",
        "",
        (f"{'check-and-set, 4 writers, 1 key':30} {'ok/s':>10} {'refused/s':>11} "
         f"{'CPU us/ok':>11}"),
        *(f"{name:30} {s['cas_per_s']:10,.0f} {s['refused_per_s']:11,.0f} "
          f"{s['cpu_us_per_cas']:11.1f}"
          for name, s in (("ours (expected key offset)", c), ("NATS KV update(last=)", k))),
        f"ours / NATS KV = {r['cas_vs_nats_kv']:.2f} (target >= 1.5)",
        "",
        (f"generator ceiling: no-op responder {r['generator']['responder_puts_per_s']:,.0f}/s, "
         f"answered by nats-server {r['generator']['server_answered_per_s']:,.0f}/s"),
        (f"load generator headroom (the better ceiling / best measured): publishes "
         f"{r['generator_put_headroom']:.2f}x, request loop {r['generator_cas_headroom']:.2f}x "
         "(>= 2 needed)"),
    ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("idempotence", __doc__, argv,
                      lambda quick: run(QUICK if quick else FULL), table)


if __name__ == "__main__":
    sys.exit(main())
