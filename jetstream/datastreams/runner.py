"""The tasks this broker runs: each one reads its source partitions, writes the destination,
and checkpoints each partition after the destination acknowledged.

Theory of operation: every RECONCILE_S, and as soon as a metadata change is applied (`wake`;
changes that come together are reconciled together, at most one pass per WAKE_S), the
runner compares the tasks the metadata assigns to
this broker with those it runs: it starts the new ones and stops (cancels) those no longer
its own, whose datastream was deleted, or whose epoch moved on without it (the coordinator
gave the task new partitions, or another broker). A task that starts — and a task that
failed, before it tries again — first renews its epoch in the metadata (`RenewTaskEpoch`,
compare-and-set on this broker and the epoch it held). The epoch fences: the destination
refuses writes of an older epoch once a newer one wrote, and a writer is never reused after
a failure, so an idempotent producer's sequences never restart within one epoch.

Each partition of a task loops: resume from the checkpoint (or the source's `start`; a
mirror from its own end when that is before the checkpoint: the copy it lost to a failover
whose ack policy was `leader` is copied again), read
a batch, write it, and commit as checkpoint what the writer says the destination holds for
good (`checkpointable`: a stream, everything it acknowledged; a file sink, what is in
complete files). A failure anywhere marks the task `faulty` with the error, closes both
ends, and tries again after a backoff that doubles from BACKOFF_S_MIN up to BACKOFF_S_MAX;
as the checkpoint only moves after acknowledged writes, a retry re-reads what may not have
been written (and the destination drops what was: message ids). A paused datastream or
partition is not read; its task reports `paused` when all of its partitions are.

Hand-off (a broker stopping on SIGTERM, `hand_off`): the runner starts no task any more,
and each partition loop stops at its next batch boundary — a write under way finishes, is
acknowledged and checkpointed; records read but not written are dropped (the checkpoint is
before them, the next owner reads them again). Once every task stopped (or HAND_OFF_S
passed: the rest are cancelled, as a crash would), it proposes `DrainTasks`: the coordinator
assigns this broker nothing more and moves its tasks at its next tick, and the runner waits
(MOVED_WAIT_S in all, the commit included) until the metadata shows none of them here, so
the new owners start while this broker is still finishing its own shutdown. With no task
assigned here it changes nothing (a whole cluster stopping may have no quorum left); when
the metadata cannot commit, the tasks move once this broker is gone, as after a crash. A
broker that starts again takes its mark off (`DrainTasks(draining=False)`) before it gets
tasks again.

Statuses, positions and counters live in `TaskRun` for /health, the diagnostics and
/metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jetstream.datastreams.commands import (
    DrainTasks,
    RenewTaskEpoch,
    StaleDatastreamGeneration,
)
from jetstream.datastreams.connector import Endpoints
from jetstream.datastreams.ends import PartitionEnds, open_ends
from jetstream.datastreams.model import DatastreamState, TaskAssignment, TaskStatus
from jetstream.datastreams.rate import TokenBucket, task_rate
from jetstream.datastreams.security import scrub, secret_values
from jetstream.errors import JetstreamError
from jetstream.raft_meta.fsm import MetadataState
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

RECONCILE_S = 0.25
#: How often the runner looks whether the metadata changed (a task assigned here starts
#: then, not at the next reconcile).
WAKE_S = 0.02
READ_WAIT_MS = 500
PAUSED_POLL_S = 0.2
BACKOFF_S_MIN = 0.2
BACKOFF_S_MAX = 10.0
LAST_ERROR_CHARS_MAX = 500
#: A stopping broker waits this long for its tasks to finish the batch under way, then for
#: the coordinator to move them.
HAND_OFF_S = 4.0
MOVED_WAIT_S = 3.0

Propose = Callable[[Any], Any]


class TaskMoved(JetstreamError):
    """The metadata gave this task to another broker or epoch: this run stops."""

    code = "TASK_MOVED"


@dataclass(slots=True)
class PartitionProgress:
    """A source partition's position (next to read), its checkpoint (what the destination
    holds for good), the source's end at the last read, and what moved."""

    position: int = -1
    checkpoint: int = -1
    end_position: int = -1
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_write_ms: int = 0
    #: The source timestamp of the newest record written, and the end it was read against.
    last_record_timestamp_ms: int = 0
    paused: bool = False

    def lag_records(self) -> int:
        return max(0, self.end_position - self.checkpoint) if self.checkpoint >= 0 else -1

    def lag_ms(self, now_ms: int) -> int:
        """How old the newest record written is while records wait (0: caught up)."""
        if self.lag_records() <= 0 or not self.last_record_timestamp_ms:
            return 0
        return max(0, now_ms - self.last_record_timestamp_ms)


@dataclass(slots=True)
class TaskRun:
    name: str
    task: int
    epoch: int
    partitions: tuple[int, ...]
    status: TaskStatus = TaskStatus.RUNNING
    last_error: str = ""
    errors: int = 0
    renewing: bool = False
    progress: dict[int, PartitionProgress] = field(default_factory=dict)
    runner: asyncio.Task[None] | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"datastream": self.name, "task": self.task, "epoch": self.epoch,
                               "partitions": list(self.partitions),
                               "status": self.status.value, "errors": self.errors}
        if self.status is TaskStatus.FAULTY:
            out["last_error"] = self.last_error
        return out


class Runner:
    def __init__(self, broker_id: int, state: Callable[[], MetadataState], propose: Propose,
                 endpoints: Callable[[], Endpoints]) -> None:
        self.broker_id = broker_id
        self._state = state
        self._propose = propose
        self._endpoints = endpoints
        self.runs: dict[tuple[str, int], TaskRun] = {}
        #: Per datastream: records read, written, and errors (counters for /metrics).
        self.counters: dict[str, dict[str, int]] = {}
        #: Per datastream and task: bytes read and written (counters for /metrics).
        self.task_bytes: dict[tuple[str, int], dict[str, int]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        #: Set by `hand_off`: partition loops stop at their next batch boundary.
        self.draining = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self._reconcile_loop(),
                                                            name="datastream-runner")

    async def stop(self) -> None:
        await cancel_and_wait(self._loop)
        await cancel_and_wait(*(r.runner for r in self.runs.values()))
        self.runs.clear()

    async def hand_off(self) -> None:
        """Stop every task once its write under way is acknowledged and checkpointed, then
        have the coordinator move them to other live brokers (see the module doc)."""
        self.draining = True
        await cancel_and_wait(self._loop)
        # A faulty task has nothing under way (it waits to try again): no need to wait.
        await cancel_and_wait(*(r.runner for r in self.runs.values()
                                if r.status is TaskStatus.FAULTY))
        runs = [r.runner for r in self.runs.values()
                if r.runner is not None and not r.runner.done()]
        started = time.monotonic()
        if runs:
            done, pending = await asyncio.wait(runs, timeout=HAND_OFF_S)
            await cancel_and_wait(*pending)
            log.info("datastream tasks: %d stopped at a batch boundary, %d cancelled, in "
                     "%.2f s", len(done), len(pending), time.monotonic() - started)
        self.runs.clear()
        if not self._assigned_here():
            return  # nothing to move: no metadata change (a cluster stopping has no quorum)
        deadline = time.monotonic() + MOVED_WAIT_S
        try:
            await asyncio.wait_for(self._propose(DrainTasks(self.broker_id, True)),
                                   MOVED_WAIT_S)
        except TimeoutError:
            log.warning("datastream tasks not handed off: the metadata did not commit in "
                        "%.1f s; they move once this broker is gone", MOVED_WAIT_S)
            return
        while self._assigned_here() and time.monotonic() < deadline:
            await asyncio.sleep(RECONCILE_S / 5)
        left = self._assigned_here()
        log.info("datastream tasks handed off in %.2f s%s", time.monotonic() - started,
                 f" ({left} still assigned here)" if left else "")

    def _assigned_here(self) -> int:
        return sum(t.broker == self.broker_id for ds in self._state().datastreams.values()
                   for t in ds.tasks)

    def wake(self) -> None:
        """A metadata command was applied: reconcile now."""
        self._woken.set()

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("datastream tasks: reconcile failed")
            await wait_event(self._woken, RECONCILE_S)
            if self._woken.is_set():
                await asyncio.sleep(WAKE_S)  # what else comes with it joins this pass
                self._woken.clear()

    async def reconcile(self) -> None:
        if self.broker_id in self._state().datastream_draining and not self.draining:
            await self._propose(DrainTasks(self.broker_id, False))  # started again
        wanted: dict[tuple[str, int], TaskAssignment] = {}
        for ds in self._state().datastreams.values():
            for t in ds.tasks:
                if t.broker == self.broker_id:
                    wanted[(ds.name, t.task)] = t
        for key, run in list(self.runs.items()):
            assigned = wanted.get(key)
            moved = assigned is None or assigned.partitions != run.partitions \
                or (assigned.epoch != run.epoch and not run.renewing)
            if moved or (run.runner is not None and run.runner.done()):
                log.info("datastream %s task %d: stopping here (epoch %d)", *key, run.epoch)
                del self.runs[key]
                await cancel_and_wait(run.runner)
        for key, assigned in wanted.items():
            if key not in self.runs and not self.draining:
                run = self.runs[key] = TaskRun(key[0], key[1], assigned.epoch,
                                               assigned.partitions)
                run.runner = asyncio.get_running_loop().create_task(
                    self._run(run), name=f"datastream-{key[0]}-{key[1]}")

    # -- one task -------------------------------------------------------------------------

    def _datastream(self, name: str) -> DatastreamState:
        ds = self._state().datastreams.get(name)
        if ds is None:
            raise TaskMoved(f"datastream {name!r} was deleted")
        return ds

    def _secrets(self, name: str) -> list[str]:
        ds = self._state().datastreams.get(name)
        return [] if ds is None else secret_values(ds.config.source.settings,
                                                   ds.config.destination.settings)

    def _check_owner(self, run: TaskRun) -> DatastreamState:
        ds = self._datastream(run.name)
        task = ds.tasks[run.task] if run.task < len(ds.tasks) else None
        if task is None or (task.broker, task.epoch) != (self.broker_id, run.epoch):
            raise TaskMoved(f"datastream {run.name!r} task {run.task} moved on")
        return ds

    async def _renew(self, run: TaskRun) -> None:
        run.renewing = True
        try:
            renewed: TaskAssignment = await self._propose(
                RenewTaskEpoch(run.name, run.task, self.broker_id, run.epoch))
            run.epoch = renewed.epoch
        finally:
            run.renewing = False

    async def _run(self, run: TaskRun) -> None:
        backoff = BACKOFF_S_MIN
        while True:
            opened: list[Any] = []
            try:
                await self._renew(run)
                ds = self._check_owner(run)
                client_id = f"datastream-{run.name}-{run.task}-b{self.broker_id}"
                ends = await open_ends(ds, run.partitions, run.epoch, self._endpoints(),
                                       client_id, opened)
                rate = task_rate(ds.config.rate_limit_records_per_s, len(ds.tasks))
                bucket = None if rate is None else TokenBucket.full(rate, time.monotonic())
                run.status = TaskStatus.RUNNING
                async with asyncio.TaskGroup() as group:
                    for p in run.partitions:
                        group.create_task(self._partition(run, p, ends[p], bucket))
                return  # the partition loops only return when the broker hands off
            except Exception as failed:
                error = _first(failed)
                if self.draining or isinstance(error, TaskMoved | StaleDatastreamGeneration):
                    return
                run.status, run.errors = TaskStatus.FAULTY, run.errors + 1
                run.last_error = scrub(f"{type(error).__name__}: {error}",
                                       self._secrets(run.name))[:LAST_ERROR_CHARS_MAX]
                self._count(run.name, "errors", 1)
                log.warning("datastream %s task %d faulty (retry in %.1f s): %s", run.name,
                            run.task, backoff, run.last_error)
            finally:
                for end in reversed(opened):  # writers before their readers
                    with contextlib.suppress(Exception):
                        await end.close()
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, BACKOFF_S_MAX)

    async def _partition(self, run: TaskRun, partition: int, ends: PartitionEnds,
                         bucket: TokenBucket | None) -> None:
        """Loop over one of the task's partitions (`ends.source_partition` at the source:
        the same number unless the source is a label selector), at the pace of the task's
        `bucket` (its share of the datastream's rate limit) when it has one."""
        reader, writer, source_partition = ends.reader, ends.writer, ends.source_partition
        progress = run.progress.setdefault(partition, PartitionProgress())
        group = self._check_owner(run).config.checkpoint_group
        checkpoint = await reader.checkpoint(group, source_partition)
        if checkpoint is None:
            checkpoint = await reader.start_position(source_partition)
            await reader.commit(group, source_partition, checkpoint)
        position = progress.position = progress.checkpoint = checkpoint
        if ends.copier is not None:  # a mirror holds the truth: go on from where it ends
            position = progress.position = min(
                checkpoint, await ends.copier.end_offset(source_partition))
        while not self.draining:
            ds = self._check_owner(run)
            progress.paused = ds.partition_paused(partition)
            if progress.paused:
                self._status(run)
                await asyncio.sleep(PAUSED_POLL_S)
                continue
            batch = await reader.read(source_partition, position,
                                      ds.config.batch_records_max, READ_WAIT_MS)
            if self.draining:
                return  # read, not written: the next owner reads it again
            progress.end_position = batch.end_position
            count = batch.record_count
            if bucket is not None and count:
                wait_s = bucket.take(count, time.monotonic())
                if wait_s > 0:
                    await asyncio.sleep(wait_s)  # the rate limit: paid before the write
            size = batch.size_bytes()
            progress.records_in += count
            progress.bytes_in += size
            self._count(run.name, "records_in", count)
            self._count_bytes(run, "bytes_in", size)
            self._check_owner(run)  # no write after the task moved (its epoch fences too)
            if batch.copied is not None and ends.copier is not None:
                await ends.copier.write_copied(source_partition, batch.copied)
            else:
                await writer.write(batch.records)  # also with none: a writer may roll by time
            if count:
                progress.records_out += count
                progress.bytes_out += size
                self._count_bytes(run, "bytes_out", size)
                progress.last_write_ms = int(time.time() * 1000)
                progress.last_record_timestamp_ms = batch.last_timestamp_ms
                self._count(run.name, "records_out", count)
            position = progress.position = batch.next_position
            durable = writer.checkpointable(source_partition, position)
            if durable is not None and durable > checkpoint:
                await reader.commit(group, source_partition, durable)
                checkpoint = progress.checkpoint = durable
            self._status(run)

    def _status(self, run: TaskRun) -> None:
        paused = all(p.paused for p in run.progress.values()) and \
            len(run.progress) == len(run.partitions)
        run.status = TaskStatus.PAUSED if paused else TaskStatus.RUNNING

    def _count(self, name: str, counter: str, value: int) -> None:
        counters = self.counters.setdefault(name, {"records_in": 0, "records_out": 0,
                                                   "errors": 0})
        counters[counter] += value

    def _count_bytes(self, run: TaskRun, counter: str, value: int) -> None:
        counters = self.task_bytes.setdefault((run.name, run.task),
                                              {"bytes_in": 0, "bytes_out": 0})
        counters[counter] += value

    # -- views ----------------------------------------------------------------------------

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        """This broker's tasks (of datastream `name`, or all), with per-partition positions."""
        out = []
        now_ms = int(time.time() * 1000)
        for (ds, _task), run in sorted(self.runs.items()):
            if name is not None and ds != name:
                continue
            described = run.describe()
            described["broker_id"] = self.broker_id
            described["partitions_progress"] = [
                {"partition": p, "source_position": pr.position,
                 "source_end_position": pr.end_position,
                 "checkpoint": pr.checkpoint, "lag_records": pr.lag_records(),
                 "lag_ms": pr.lag_ms(now_ms),
                 "records_in": pr.records_in, "records_out": pr.records_out,
                 "bytes_in": pr.bytes_in, "bytes_out": pr.bytes_out,
                 "last_write_ms": pr.last_write_ms, "paused": pr.paused}
                for p, pr in sorted(run.progress.items())]
            out.append(described)
        return out

    def render_metrics(self) -> list[str]:
        lines = []
        for name, text in (("records_in", "Records read from datastream sources."),
                           ("records_out", "Records the destinations acknowledged."),
                           ("errors", "Datastream task failures (each retried).")):
            lines += [f"# HELP jetstream_datastream_{name}_total {text}",
                      f"# TYPE jetstream_datastream_{name}_total counter"]
            lines += [f'jetstream_datastream_{name}_total{{datastream="{ds}"}} {c[name]}'
                      for ds, c in sorted(self.counters.items())]
        bytes_texts = (("bytes_in", "Bytes (keys, values, headers) read from sources."),
                       ("bytes_out", "Bytes (keys, values, headers) destinations acknowledged."))
        for name, text in bytes_texts:
            lines += [f"# HELP jetstream_datastream_{name}_total {text}",
                      f"# TYPE jetstream_datastream_{name}_total counter"]
            lines += [f'jetstream_datastream_{name}_total{{datastream="{ds}",task="{task}"}} '
                      f"{c[name]}" for (ds, task), c in sorted(self.task_bytes.items())]
        lines += [("# HELP jetstream_datastream_lag_records Records of a source partition "
                   "not yet written, as of the last read."),
                  "# TYPE jetstream_datastream_lag_records gauge"]
        for (ds, _task), run in sorted(self.runs.items()):
            for p, pr in sorted(run.progress.items()):
                lines.append(f'jetstream_datastream_lag_records{{datastream="{ds}",'
                             f'partition="{p}"}} {max(pr.lag_records(), 0)}')
        return lines


def _first(error: BaseException) -> BaseException:
    """The first error inside (nested) exception groups: a task group's failure."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
