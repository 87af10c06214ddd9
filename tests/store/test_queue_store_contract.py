"""The QueueStore contract (tidemq/store/queues/contract.py), run over every implementation and
option in QUEUE_STORE_FACTORIES.  Behaviour only: what a reader and a reopened store see, never
how an implementation keeps it.  To run it over another implementation, append its factory."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.store.light.kv_queue import KvQueue
from tidemq.store.queues.consume_queue import DEFAULT_UNITS_PER_FILE, MAPPINGS, ConsumeQueue
from tidemq.store.queues.contract import QueueStore
from tidemq.store.queues.queue_set import ConsumeQueueStore

TOPIC, QUEUE_ID = "ContractTopic", 3


@dataclass(frozen=True)
class QueueStoreFactory:
    """`open(directory)` opens the queue (TOPIC, QUEUE_ID) kept under `directory`: a new, empty
    queue the first time, the same queue again after it was closed."""

    name: str
    open: Callable[[Path], QueueStore]


def file_queue(units_per_file: int) -> Callable[[Path], QueueStore]:
    return lambda directory: ConsumeQueue(directory, TOPIC, QUEUE_ID, units_per_file)


def queue_of_the_set(directory: Path) -> QueueStore:
    """As the store makes its queues: by its set of queues, each frontier a row of one table."""
    return ConsumeQueueStore(directory, units_per_file=4).get_or_create(TOPIC, QUEUE_ID)


def queue_with_one_mapping(directory: Path) -> QueueStore:
    """Files of 3 units and a budget of one mapped file: every other file's mapping is dropped
    and made again when used (the budget is restored after each test)."""
    MAPPINGS.budget = 1
    return ConsumeQueue(directory, TOPIC, QUEUE_ID, units_per_file=3)


QUEUE_STORE_FACTORIES: list[QueueStoreFactory] = [
    QueueStoreFactory("file-default-size", file_queue(DEFAULT_UNITS_PER_FILE)),
    QueueStoreFactory("file-4-units", file_queue(4)),
    QueueStoreFactory("queue-set", queue_of_the_set),
    QueueStoreFactory("file-one-mapping", queue_with_one_mapping),
    QueueStoreFactory("light-kv", lambda directory: KvQueue.open(directory, "%LMQ%contract")),
]


@pytest.fixture(autouse=True)
def mapping_budget_restored():
    budget = MAPPINGS.budget
    yield
    MAPPINGS.budget = budget


@pytest.fixture(params=QUEUE_STORE_FACTORIES, ids=lambda factory: factory.name)
def factory(request) -> QueueStoreFactory:
    return request.param


def units(queue: QueueStore, offset: int = 0, max_count: int = 1000) -> list[tuple[int, int, int, int]]:
    return [(u.queue_offset, u.commit_log_offset, u.size, u.tags_code) for u in queue.read(offset, max_count)]


def unit_of(slot: int) -> tuple[int, int, int]:
    """A unit for `slot`: its record at 100 * slot, 100 bytes, a tags code of its own."""
    return 100 * slot, 100, slot - 5


def put_slots(queue: QueueStore, slots) -> None:
    for slot in slots:
        assert queue.put(slot, *unit_of(slot))


def reopened(factory: QueueStoreFactory, queue: QueueStore, directory: Path) -> QueueStore:
    queue.flush()
    queue.close()
    return factory.open(directory)


def test_every_factory_makes_a_queue_store(factory, tmp_path):
    assert isinstance(factory.open(tmp_path), QueueStore)


def test_a_new_queue_holds_nothing(factory, tmp_path):
    queue = factory.open(tmp_path)
    assert queue.is_empty
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 0, 0)
    assert queue.read(0, 10) == []
    assert reopened(factory, queue, tmp_path).is_empty


def test_units_put_in_order_are_read_back(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(10))
    assert not queue.is_empty
    assert (queue.min_offset, queue.max_offset, queue.commit_frontier) == (0, 10, 10)
    assert units(queue) == [(slot, *unit_of(slot)) for slot in range(10)]
    assert queue.max_physical_offset == 1000


def test_reads_start_at_the_minimum_and_stop_at_the_count_or_the_frontier(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(10))
    assert [u[0] for u in units(queue, 3, 4)] == [3, 4, 5, 6]
    assert [u[0] for u in units(queue, 8, 100)] == [8, 9]
    assert units(queue, 10, 5) == [] and units(queue, 50, 5) == []
    queue.correct_min_offset(200)
    assert [u[0] for u in units(queue, 0, 3)] == [2, 3, 4]


def test_a_late_first_slot_starts_the_queue_there(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(6)
    assert (queue.min_offset, queue.max_offset) == (6, 6)
    put_slots(queue, [6, 7])
    assert [u[0] for u in units(queue, 0)] == [6, 7]
    queue = reopened(factory, queue, tmp_path)
    assert (queue.min_offset, queue.max_offset) == (6, 8)
    assert units(queue, 0) == [(6, *unit_of(6)), (7, *unit_of(7))]


def test_slots_written_out_of_order_are_hidden_until_the_gap_is_committed(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    for slot in (0, 1, 4):
        assert queue.write(slot, *unit_of(slot))
    assert queue.max_offset == 0 and queue.read(0, 10) == []  # written, not committed
    assert queue.commit(0) and queue.commit(1)
    assert not queue.commit(4)  # above a gap: the frontier stays
    assert queue.max_offset == 2 and [u[0] for u in units(queue)] == [0, 1]
    assert queue.write(3, *unit_of(3)) and not queue.commit(3)
    assert queue.max_offset == 2
    assert queue.write(2, *unit_of(2)) and queue.commit(2)  # closes the gap: past 3 and 4 too
    assert queue.max_offset == 5
    assert units(queue) == [(slot, *unit_of(slot)) for slot in range(5)]


def test_a_slot_below_the_frontier_is_left_as_it_is(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, [0, 1])
    assert not queue.put(0, 9999, 10, 7)
    assert not queue.write(1, 9999, 10, 7)
    assert queue.max_offset == 2
    assert units(queue) == [(0, *unit_of(0)), (1, *unit_of(1))]


def test_offset_for_timestamp_finds_the_first_and_the_last_slot_of_a_time(factory, tmp_path):
    queue = factory.open(tmp_path)
    assert queue.offset_for_timestamp(100, lambda offset: 0) == queue.min_offset  # empty
    queue.initialize_at(0)
    stamps = [100, 200, 200, 200, 300, 400]
    put_slots(queue, range(len(stamps)))
    store_time_of = {unit_of(slot)[0]: stamp for slot, stamp in enumerate(stamps)}.get
    assert queue.offset_for_timestamp(200, store_time_of) == 1
    assert queue.offset_for_timestamp(200, store_time_of, upper=True) == 3
    assert queue.offset_for_timestamp(250, store_time_of) == 4
    assert queue.offset_for_timestamp(250, store_time_of, upper=True) == 3
    assert queue.offset_for_timestamp(50, store_time_of) == 0
    assert queue.offset_for_timestamp(999, store_time_of) == 6  # past the last: the frontier
    assert queue.offset_for_timestamp(50, store_time_of, upper=True) == 0  # clamped to the minimum
    # a record that is gone (no store time) counts as older than every time
    gone_first = {**{unit_of(0)[0]: None}, **{unit_of(s)[0]: t for s, t in enumerate(stamps) if s}}.get
    assert queue.offset_for_timestamp(100, gone_first) == 1


def test_truncate_forgets_the_units_of_records_past_the_cut(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(10))
    assert queue.truncate(650) == 3  # the records at 700, 800 and 900 are gone
    assert queue.max_offset == 7 and queue.max_physical_offset == 700
    assert [u[0] for u in units(queue)] == list(range(7))
    assert queue.truncate(650) == 0
    assert queue.put(7, 650, 50, 1)  # the slot is free again
    queue = reopened(factory, queue, tmp_path)
    assert queue.max_offset == 8
    assert units(queue, 6) == [(6, *unit_of(6)), (7, 650, 50, 1)]


def test_truncating_every_unit_empties_the_readable_range(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(5))
    assert queue.truncate(0) == 5
    assert queue.max_offset == queue.min_offset == 0
    assert queue.read(0, 10) == [] and queue.max_physical_offset == 0


def test_correct_min_offset_moves_past_the_records_that_are_gone(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(10))
    queue.correct_min_offset(450)  # the log below 450 is deleted: slots 0-4 point there
    assert (queue.min_offset, queue.max_offset) == (5, 10)
    assert [u[0] for u in units(queue)] == [5, 6, 7, 8, 9]
    queue.correct_min_offset(450)
    assert queue.min_offset == 5
    queue = reopened(factory, queue, tmp_path)
    assert queue.min_offset <= 5 and queue.max_offset == 10  # the store corrects it again at open
    assert [u[0] for u in units(queue, 5)] == [5, 6, 7, 8, 9]


def test_committed_units_survive_a_reopen_and_uncommitted_ones_do_not(factory, tmp_path):
    queue = factory.open(tmp_path)
    queue.initialize_at(0)
    put_slots(queue, range(5))
    assert queue.write(6, *unit_of(6)) and not queue.commit(6)  # above the gap at 5
    queue = reopened(factory, queue, tmp_path)
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 5, 500)
    assert units(queue) == [(slot, *unit_of(slot)) for slot in range(5)]
    assert queue.put(5, *unit_of(5))
    assert queue.max_offset == 6  # slot 6 was never committed: it is not there any more
    assert [u[0] for u in units(queue)] == [0, 1, 2, 3, 4, 5]


@given(first=st.integers(0, 9), order=st.permutations(range(12)), commit_late=st.sets(st.integers(0, 11)))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_frontier_is_the_first_slot_not_committed_whatever_the_order(factory, first, order, commit_late):
    """Slots written and committed in any order (some committed only after every write): after
    each step, readers see exactly the committed slots below the first gap."""
    with tempfile.TemporaryDirectory() as directory:
        queue = factory.open(Path(directory))
        queue.initialize_at(first)
        committed: set[int] = set()

        def check() -> None:
            frontier = first
            while frontier - first in committed:
                frontier += 1
            assert queue.max_offset == frontier
            assert units(queue, 0) == [(slot, *unit_of(slot)) for slot in range(first, frontier)]

        for index in order:
            slot = first + index
            assert queue.write(slot, *unit_of(slot))
            if index not in commit_late:
                before = queue.max_offset
                assert queue.commit(slot) == (queue.max_offset != before)
                committed.add(index)
                check()
        for index in sorted(commit_late, key=order.index):
            queue.commit(first + index)
            committed.add(index)
            check()
        assert queue.max_offset == first + 12
        queue.close()
