"""The parallel dispatcher's coordinator (RIP-52) driven by scripted events: the commands it
gives, and the order it commits in, for completions in any order, workers dying, dispatch
stopping with batches in flight, and batches cut at their limits.  Then random scripts over a
real log, carried out with in-process builders, against the single thread's files."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_parallel_dispatch import build_log, sequential_build
from trees import same_tree

from tidemq.store.dispatch.builder import NO_SPACE, BatchBuilder
from tidemq.store.dispatch.commit import QueueCommitter
from tidemq.store.dispatch.coordinator import (
    BATCHES_PER_WORKER,
    MAX_WORKER_DEATHS_IN_A_ROW,
    MIN_BATCH_BYTES,
    OUTSTANDING_PER_WORKER,
    UNBUILT_PER_WORKER,
    AppendProgress,
    AskAppend,
    BuildHere,
    Commit,
    Coordinator,
    Forward,
    Respawn,
    Retire,
    Send,
    Stall,
    UndoIndex,
    WriteHere,
)
from tidemq.store.dispatch.index_appends import append_request, undo
from tidemq.store.dispatch.messages import BatchResult, BatchTask, IndexAppend, IndexAppended, QueueRuns
from tidemq.store.dispatch.parallel import apply_append_progress, commit_batch, cut_batch
from tidemq.store.index.key_index import KeyIndex
from tidemq.store.queues.consume_queue import ConsumeQueue
from tidemq.store.queues.queue_set import ConsumeQueueStore

SIZE = 1000  # each scripted batch's bytes


def coordinator(workers: int = 2, index: bool = False, inline_bytes: int = 0, batch_bytes: int = SIZE) -> Coordinator:
    return Coordinator(workers, 0, batch_bytes=batch_bytes, inline_bytes=inline_bytes, index=index)


def cut(c: Coordinator, count: int, limit: int = 1 << 30) -> tuple[list[BatchTask], list]:
    """Cut `count` batches of SIZE bytes: (the tasks, the commands given)."""
    tasks, commands = [], []
    for _ in range(count):
        assert c.next_cut(limit) is not None
        task = BatchTask(c.next_id, "segment", 0, 1 << 30, c.cut_offset, c.cut_offset + SIZE)
        tasks.append(task)
        commands += c.cut(task, limit)
    return tasks, commands


def answer(task: BatchTask, held: int = 0, handovers=(), end: int | None = None, error: str | None = None) -> BatchResult:
    """A worker's answer for `task`: one record, `held` index entries kept."""
    i32, i64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    stop = task.end if end is None else end
    return BatchResult(
        task.batch_id, task.begin, stop, error, 1, 7, QueueRuns.empty(), i32, i64, i64, held, list(handovers)
    )


def committed(commands) -> list[int]:
    return [command.task.batch_id for command in commands if type(command) is Commit]


# ---------------------------------------------------------------------------------------------
# Scripted events


def test_batches_answered_out_of_order_are_committed_in_order_once_the_head_is_in():
    c = coordinator(workers=2)
    tasks, commands = cut(c, 4)
    # each to the least busy worker, the lower number first
    assert commands == [Send(0, tasks[0]), Send(1, tasks[1]), Send(0, tasks[2]), Send(1, tasks[3])]
    assert c.sent_to(0) == [0, 2] and c.sent_to(1) == [1, 3]
    for worker, i in ((1, 3), (0, 2), (1, 1)):
        assert c.answered(worker, answer(tasks[i])) == []  # the head (0) is not in
        assert c.outstanding == 4 and c.head_id == 0
    commands = c.answered(0, answer(tasks[0]))
    assert commands == [Commit(tasks[i], commands[i].result) for i in range(4)]
    assert [command.result.end for command in commands] == [task.end for task in tasks]
    assert c.outstanding == 0 and c.head_id == 4 and not c.awaiting_workers
    assert c.answered(1, answer(tasks[1])) == []  # a second answer for a committed batch is ignored


def test_the_head_waits_for_its_index_append_and_the_next_holder_is_asked_after_it():
    c = coordinator(workers=2, index=True)
    tasks, _ = cut(c, 3)
    # batch 1 answers first: the head's builder (worker 0) is asked to append as soon as it builds
    assert c.answered(1, answer(tasks[1], held=5)) == [AskAppend(0, 0)]
    assert c.answered(0, answer(tasks[0], held=4)) == []  # the append is under way: nothing moves
    assert c.awaiting_workers
    commands = c.index_appended(IndexAppended(0, 4, 0, 0, 111))
    assert commands[:2] == [AppendProgress(111, None), Commit(tasks[0], commands[1].result)]
    assert commands[2:] == [AskAppend(1, 1)]  # the next head's holder, after the commit
    # the newest index file fills: the rest goes to the next file, asked again of the same worker
    assert c.index_appended(IndexAppended(1, 3, 2, 150, 140)) == [AppendProgress(140, 150), AskAppend(1, 1)]
    commands = c.index_appended(IndexAppended(1, 2, 0, 0, 160))
    assert commands[0] == AppendProgress(160, None) and committed(commands) == [1]
    assert commands[2:] == [AskAppend(0, 2)]  # batch 2, not answered: its builder is asked
    assert c.index_appended(IndexAppended(0, 9, 0, 0, 1)) == []  # an answer for another batch
    assert c.worker_appends == 3


def test_a_failed_index_append_is_undone_and_the_batch_built_here():
    c = coordinator(workers=1, index=True)
    tasks, _ = cut(c, 2)
    assert c.answered(0, answer(tasks[1], held=2)) == [AskAppend(0, 0)]  # asked before building the head
    assert c.answered(0, answer(tasks[0], held=2)) == []
    assert c.index_appended(IndexAppended(0, 0, 0, 0, 0, "disk")) == [UndoIndex(tasks[0], "disk"), BuildHere(tasks[0])]
    assert c.inline_batches == 1 and c.outstanding == 2
    c.built_here(answer(tasks[0]))  # built here: no entries held
    assert c.has_done
    commands = c.take_done()
    assert committed(commands) == [0] and commands[1:] == [AskAppend(0, 1)]


def test_units_handed_over_complete_a_batch_once_their_owner_wrote_them():
    c = coordinator(workers=2)
    tasks, _ = cut(c, 2)
    assert c.answered(0, answer(tasks[0], handovers=[(1, b"units")])) == [Forward(1, 0, b"units")]
    assert c.handed_to(1) == [0] and c.handovers_forwarded == 1
    assert c.answered(1, answer(tasks[1])) == []  # the head waits for its units
    assert committed(c.units_written(1, 0)) == [0, 1]
    # a batch built again hands over the same units: only its first answer's are forwarded
    c2 = coordinator(workers=2)
    tasks, _ = cut(c2, 1)
    c2.answered(0, answer(tasks[0], handovers=[(1, b"u")]))
    commands = c2.units_written(1, 0, "no space")  # the owner could not write them: written here
    assert commands[0] == WriteHere(0, b"u", 1, "no space") and committed(commands) == [0]


def test_a_worker_dying_mid_batch_is_replaced_and_sent_what_it_owed():
    c = coordinator(workers=2, index=True)
    tasks, _ = cut(c, 5)  # worker 0: 0, 2, 4; worker 1: 1, 3
    assert c.answered(1, answer(tasks[1], held=3, handovers=[(0, b"for-0")])) == [Forward(0, 1, b"for-0")]
    assert c.answered(1, answer(tasks[3], held=3)) == [AskAppend(0, 0)]  # the head's builder
    assert c.answered(0, answer(tasks[2], held=1)) == []
    # worker 0 dies while building batch 0, asked to append it; it held batch 2's entries and
    # owed the units batch 1 handed it
    commands = c.worker_died(0)
    assert commands == [
        UndoIndex(tasks[0]),  # it may have written part of batch 0's entries
        Respawn(0, 3),
        Forward(0, 1, b"for-0"),  # the units first: the head may wait for them
        Send(0, tasks[0]),
        Send(0, tasks[2]),
        Send(0, tasks[4]),
    ]
    assert c.workers_restarted == 1 and c.sent_to(0) == [0, 2, 4] and c.handed_to(0) == [1]
    assert c.worker_batches == 5  # sending again is not counted
    assert c.answered(0, answer(tasks[2], held=1)) == [AskAppend(0, 0)]
    assert c.answered(0, answer(tasks[0], held=2)) == []
    commands = c.index_appended(IndexAppended(0, 2, 0, 0, 5))
    assert committed(commands) == [0] and c.head_id == 1  # batch 1 waits for the units it handed over
    assert c.units_written(0, 1) == [AskAppend(1, 1)]
    assert committed(c.index_appended(IndexAppended(1, 3, 0, 0, 6))) == [1]


def test_a_worker_dying_after_answering_takes_the_entries_it_held_with_it():
    c = coordinator(workers=2, index=True)
    tasks, _ = cut(c, 2)
    assert c.answered(1, answer(tasks[1], held=4)) == [AskAppend(0, 0)]
    assert c.worker_died(1) == [Respawn(1, 1), Send(1, tasks[1])]  # its answer is void
    assert c.answered(0, answer(tasks[0])) == []
    commands = c.index_appended(IndexAppended(0, 0, 0, 0, 0))  # it held none
    assert commands[0] == AppendProgress(0, None) and committed(commands) == [0]
    assert commands[2:] == [AskAppend(1, 1)]  # the replacement, once it has built batch 1
    assert c.answered(1, answer(tasks[1], held=4)) == []
    assert committed(c.index_appended(IndexAppended(1, 4, 0, 0, 9))) == [1]


def test_a_worker_dying_asked_to_append_a_batch_it_answered_holding_nothing_lets_the_head_go():
    """The head's builder was asked to append before its answer came (holding no entries), and
    died before reading the request: nothing was appended, so the head is committed."""
    c = coordinator(workers=2, index=True)
    tasks, _ = cut(c, 2)
    assert c.answered(1, answer(tasks[1])) == [AskAppend(0, 0)]
    assert c.answered(0, answer(tasks[0])) == []  # no entries held; the append is under way
    commands = c.worker_died(0)
    assert commands[0] == Respawn(0, 0) and committed(commands) == [0, 1]
    assert not c.awaiting_workers and c.outstanding == 0


def test_workers_dying_too_often_give_way_to_the_dispatching_thread():
    c = coordinator(workers=2)
    tasks, _ = cut(c, 2)
    for death in range(1, MAX_WORKER_DEATHS_IN_A_ROW):
        assert c.worker_died(1) == [Respawn(1, 1), Send(1, tasks[1])]
    c.answered(0, answer(tasks[0], handovers=[(1, b"u")]))  # an answer: the count starts again
    for death in range(1, MAX_WORKER_DEATHS_IN_A_ROW):
        c.worker_died(1)
    commands = c.worker_died(1)
    assert commands == [Retire(1, MAX_WORKER_DEATHS_IN_A_ROW, True), WriteHere(0, b"u"), BuildHere(tasks[1])]
    assert c.inline_only and c.workers() == [0]
    c.built_here(answer(tasks[1]))
    assert committed(c.take_done()) == [0, 1]
    tasks, commands = cut(c, 1)
    assert commands == [BuildHere(tasks[0])]  # one batch at a time, here
    assert c.next_cut(1 << 30) is None


def test_dispatch_stops_where_the_head_walk_ended_short_and_drops_the_batches_in_flight():
    c = coordinator(workers=2)
    tasks, _ = cut(c, 4)
    c.answered(1, answer(tasks[1], handovers=[(0, b"u")]))
    c.answered(1, answer(tasks[3]))
    short = tasks[0].begin + 300  # the rest of the log was not readable yet
    commands = c.answered(0, answer(tasks[0], end=short))
    assert commands == [Commit(tasks[0], commands[0].result), Stall(short)]
    assert c.outstanding == 0 and c.cut_offset == short and c.head_id == c.next_id == 4
    assert not c.awaiting_workers and c.sent_to(0) == [] and c.sent_to(1) == []
    # what the workers still answer for the dropped batches is ignored
    assert c.answered(0, answer(tasks[2])) == []
    assert c.units_written(0, 1) == []
    # cut again from there, numbered on
    again, commands = cut(c, 1)
    assert again[0].batch_id == 4 and again[0].begin == short and commands == [Send(0, again[0])]
    # an error stops it too, at the end the walk reached
    damaged = c.answered(0, answer(again[0], end=short + 10, error="bad record"))
    assert committed(damaged) == [4] and damaged[-1] == Stall(short + 10)


def test_batches_are_cut_to_the_backlog_within_their_limits():
    workers = 2
    c = coordinator(workers=workers, inline_bytes=64 << 10, batch_bytes=16 << 20)
    assert c.next_cut(0) is None  # nothing to cut
    backlog = 200 << 20
    assert c.next_cut(backlog) == 16 << 20  # at most batch_bytes
    assert c.next_cut(40 << 20) == (40 << 20) // (BATCHES_PER_WORKER * workers)
    assert c.next_cut(3 << 20) == MIN_BATCH_BYTES  # not cut finer than its fixed costs
    # as many outstanding as the limits allow: UNBUILT_PER_WORKER sent to each worker
    sent = 0
    while c.next_cut(backlog) is not None:
        task = BatchTask(c.next_id, "segment", 0, 1 << 30, c.cut_offset, c.cut_offset + 1000)
        sent += len(c.cut(task, backlog))
    assert sent == c.outstanding == UNBUILT_PER_WORKER * workers
    c.answered(1, answer(BatchTask(1, "segment", 0, 1 << 30, 1000, 2000)))
    assert c.next_cut(backlog) is not None and c.outstanding < OUTSTANDING_PER_WORKER * workers


def test_a_small_backlog_is_built_here_and_a_blank_moves_past_the_segment_end():
    c = coordinator(workers=2, inline_bytes=64 << 10)
    task = BatchTask(0, "segment", 0, 4096, 0, 1000)
    assert c.cut(task, 2000) == [BuildHere(task)]  # the backlog is under inline_bytes, nothing in flight
    c.built_here(answer(task))
    assert committed(c.take_done()) == [0]
    blank = BatchTask(1, "segment", 0, 4096, 1000, 1000)  # the blank closing the segment
    assert c.cut(blank, 1 << 30, resume=4096) == [] and c.cut_offset == 4096
    commands = c.take_done()
    assert committed(commands) == [1] and commands[0].result.end == 4096 and commands[0].result.records == 0
    with pytest.raises(ValueError):  # not where the coordinator cuts next
        c.cut(BatchTask(2, "segment", 0, 4096, 0, 1000), 1 << 30)


# ---------------------------------------------------------------------------------------------
# Random scripts over a real log, carried out with in-process builders


class ScriptedWorkers:
    """Carries out a `Coordinator`'s commands with in-process BatchBuilders, one per worker
    number, each owning its share of the queues; the messages to and from the workers are
    delivered in an order `rng` chooses, and a worker may die (its undelivered messages lost)
    before or after it did what it was sent.  After every commit the readers' view is checked."""

    def __init__(self, log, cqs, index, workers, batch_bytes, rng, check, hold_index, mappings, deaths) -> None:
        self.log, self.cqs, self.index, self.rng, self.check = log, cqs, index, rng, check
        self.coordinator = Coordinator(workers, 0, batch_bytes=batch_bytes, inline_bytes=0, index=True)
        self.committer = QueueCommitter(cqs)
        self.hold_index, self.mappings, self.deaths = hold_index, mappings, deaths
        self.workers = workers
        self.builders = {n: self._builder(n) for n in range(workers)}
        self.here = BatchBuilder(str(cqs.root), cqs.units_per_file, True)
        self.pending: list[tuple[int, object]] = []  # (worker, message to it), not yet carried out
        self.dispatched = 0
        self.changes: dict = {}

    def _builder(self, owner: int) -> BatchBuilder:
        builder = BatchBuilder(str(self.cqs.root), self.cqs.units_per_file, True)
        if self.mappings is not None:  # a small budget: the builders hand the others' queues over
            builder.max_queue_files = self.mappings
        builder.hold_index = self.hold_index
        builder.owner, builder.owners = owner, self.workers
        return builder

    def run(self, commands) -> None:
        for command in commands:
            kind = type(command)
            if kind is Commit:
                assert command.task.begin == self.dispatched  # in log order, none skipped
                commit_batch(self.committer, self.index, command.result, self.changes, True)
                self.dispatched = command.result.end
                self.check()
            elif kind is Send:
                self.pending.append((command.worker, command.task))
            elif kind is Forward:
                self.pending.append((command.worker, pickle.loads(command.payload)))
            elif kind is AskAppend:
                request = append_request(self.index, command.batch_id)
                assert request.skip_below == self.index.indexed_until
                self.pending.append((command.worker, request))
            elif kind is BuildHere:
                self.coordinator.built_here(self.here.build(command.task))
            elif kind is WriteHere:
                self.here.write_handover(pickle.loads(command.payload))
            elif kind is AppendProgress:
                apply_append_progress(self.index, command)
            elif kind is UndoIndex:
                undo(self.index, self.log, command.task.begin)
            elif kind is Respawn:
                self.builders[command.worker].close()
                self.builders[command.worker] = self._builder(command.worker)
            elif kind is Retire:
                self.builders.pop(command.worker).close()
            elif kind is not Stall:
                raise AssertionError(command)

    def deliver(self) -> None:
        """Carry out some of the messages sent, in a random order (but a batch's append request
        with the batch, as a worker appends the head's entries as it finishes building it);
        maybe a worker dies."""
        c = self.coordinator
        if c.has_done:
            self.run(c.take_done())
            return
        self.rng.shuffle(self.pending)
        take = self.rng.randint(1, len(self.pending))
        chosen, self.pending = self.pending[:take], self.pending[take:]
        while chosen:
            worker, message = chosen.pop(0)
            if worker not in self.builders:
                continue  # sent before it was let go
            builder = self.builders[worker]
            task, append = None, None
            if type(message) is BatchTask:
                task, append = message, self._take(worker, IndexAppend, message.batch_id, chosen)
            elif type(message) is IndexAppend:
                task, append = self._take(worker, BatchTask, message.batch_id, chosen), message
            else:
                builder.write_handover(message)
            replies = []
            if task is not None:
                replies.append(builder.build(task))
            if append is not None:
                if task is None or replies[0].index_held:
                    replies.append(builder.append_index(append))
                else:
                    replies.append(IndexAppended(append.batch_id, 0, 0, 0, 0))
            if self.deaths and self.rng.random() < 0.05:
                self.deaths -= 1  # it dies having done the work, before its answers are read
                self.pending = [(w, m) for w, m in self.pending + chosen if w != worker]
                self.run(c.worker_died(worker))
                return
            if not replies:
                self.run(c.units_written(worker, message.batch_id))
            for reply in replies:
                if type(reply) is IndexAppended:
                    self.run(c.index_appended(reply))
                else:
                    self.run(c.answered(worker, reply))

    def _take(self, worker: int, kind: type, batch_id: int, chosen: list):
        """The message of `kind` for `batch_id` sent to `worker` and not carried out, taken."""
        for messages in (chosen, self.pending):
            for i, (w, m) in enumerate(messages):
                if w == worker and type(m) is kind and m.batch_id == batch_id:
                    del messages[i]
                    return m
        return None

    def dispatch_until(self, limit: int) -> None:
        c = self.coordinator
        while True:
            while (size := c.next_cut(limit)) is not None:
                batch = cut_batch(self.log, c.next_id, c.cut_offset, limit, size)
                if batch is None:
                    break
                self.run(c.cut(batch[0], limit, batch[1]))
            if not c.outstanding:
                return
            self.deliver()

    def close(self) -> None:
        for builder in [*self.builders.values(), self.here]:
            builder.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(["many", "few", "hot"]),
    count=st.integers(50, 400),
    workers=st.integers(1, 4),
    batch_bytes=st.integers(300, 6000),
    seed=st.integers(0, 2**32 - 1),
    hold_index=st.booleans(),
    hand_over=st.booleans(),
    deaths=st.integers(0, 6),
)
def test_random_completion_orders_never_show_gaps_and_build_identical_files(
    tmp_path_factory, layout, count, workers, batch_bytes, seed, hold_index, hand_over, deaths
):
    base = tmp_path_factory.mktemp("orders")
    rng = random.Random(seed)
    if layout == "many":
        queues = [(f"topic{rng.randrange(3)}", rng.randrange(40)) for _ in range(count)]
    elif layout == "few":
        queues = [("t", rng.randrange(3)) for _ in range(count)]
    else:
        queues = [("hot", 0) if rng.random() < 0.9 else ("cold", rng.randrange(4)) for _ in range(count)]
    log, assigned = build_log(base / "log", queues, segment_size=8192)
    sequential_build(log, base / "sequential", units=32)
    expected = {key: ConsumeQueue(base / "sequential" / "consumequeue", *key) for key in assigned}
    cqs = ConsumeQueueStore(base / "parallel" / "consumequeue", 32)
    index = KeyIndex(base / "parallel" / "index", 64, 200)
    frontiers: dict = {}

    def check() -> None:
        for key, cq in cqs.queues.items():
            units = cq.read(0, 10_000)
            # no gap, no reordering: exactly the first slots, equal to the sequential build
            assert [u.queue_offset for u in units] == list(range(len(units)))
            assert units == expected[key].read(0, len(units))
            assert cq.commit_frontier == len(units)
        for key, frontier in scripted.changes.items():  # every queue moved is announced
            assert frontier > frontiers.get(key, 0), "a listener was told of nothing new"
            assert cqs.queues[key].commit_frontier >= frontier
            frontiers[key] = frontier
        scripted.changes = {}

    scripted = ScriptedWorkers(
        log, cqs, index, workers, batch_bytes, rng, check, hold_index, 2 if hand_over else None, deaths
    )
    scripted.dispatch_until(log.write_position)
    assert scripted.dispatched == log.write_position
    c = scripted.coordinator
    event(f"workers replaced: {c.workers_restarted > 0}, given way: {c.inline_only}")
    if hold_index:
        assert c.worker_appends > 0  # entries appended by the "workers", in order
    if hand_over and workers > 1 and layout != "hot" and not c.inline_only:
        assert c.handovers_forwarded > 0  # queues of another worker's share were in batches
    assert frontiers == assigned  # every committed entry was announced, up to the last
    for cq in expected.values():
        cq.close()
    scripted.close()
    cqs.close()
    index.close()
    assert same_tree(base / "sequential", base / "parallel") == []


def test_a_full_disk_drops_the_head_and_every_later_batch_to_cut_them_again():
    # a worker built nothing for want of space: the head waits, nothing is committed
    c = coordinator(workers=2)
    tasks, _ = cut(c, 3)
    c.answered(1, answer(tasks[1]))
    full = f"{NO_SPACE}: No space left on device"
    commands = c.answered(0, answer(tasks[0], end=tasks[0].begin, error=full))
    assert commands == [Stall(tasks[0].begin, full)] and c.cut_offset == tasks[0].begin and c.outstanding == 0
    # units handed over could not be written: back to the head's beginning
    c = coordinator(workers=2)
    tasks, _ = cut(c, 2)
    c.answered(0, answer(tasks[0]))  # committed
    c.answered(1, answer(tasks[1], handovers=[(0, b"u")]))
    assert c.units_written(0, 1, full) == [Stall(tasks[1].begin, full)]
    # the head's commit failed appending its index entries: cut again from its beginning
    c = coordinator(workers=1)
    tasks, _ = cut(c, 2)
    commit = c.answered(0, answer(tasks[0]))[0]
    assert c.commit_failed(commit.task, full) == [Stall(tasks[0].begin, full)]
    again, _ = cut(c, 1)
    assert again[0].begin == tasks[0].begin and again[0].batch_id == 2
    assert c.answered(0, answer(tasks[1])) == []  # the dropped batch's answer is ignored
