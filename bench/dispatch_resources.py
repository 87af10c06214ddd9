"""Dispatch resource figures: queue-file mappings, the workers' heap settings, builder state.

    .venv/bin/python bench/dispatch_resources.py [--dir DIR]

Linux only (reads /proc/PID/maps and /proc/PID/environ).  Prints:
- new queues: the queue files this process has mapped after the coordinator adopts and commits
  new queues that start their files, and after a reader reads each (files are mapped by their
  first reader, not by the commit);
- the dispatch thread alone over known queues: the queue files mapped at the end, with the
  queues' mapping budget shrunk under a reader that maps every queue, against the two budgets
  (the thread lets go of the mappings the queues let go);
- two worker processes: the queues each maps, of its own share and of the other's (while under
  half its budget a worker writes the other's queues into their files instead of handing them
  over), and whether each runs with the heap settings of `workers.MALLOC_ENV`;
- a builder's state: the entries its containers hold after batches of light-queue topics (each
  a topic of its own), before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from tidemq.store import record  # noqa: E402
from tidemq.store.dispatch.builder import BatchBuilder, owner_of  # noqa: E402
from tidemq.store.dispatch.parallel import ParallelDispatcher, cut_batch  # noqa: E402
from tidemq.store.dispatch.workers import MALLOC_ENV  # noqa: E402
from tidemq.store.index.key_index import KeyIndex  # noqa: E402
from tidemq.store.log.commit_log import CommitLog  # noqa: E402
from tidemq.store.queues import consume_queue  # noqa: E402
from tidemq.store.queues.consume_queue import ConsumeQueue, FrontierTable  # noqa: E402
from tidemq.store.queues.queue_set import ConsumeQueueStore  # noqa: E402


def build_log(directory: Path, queues: list[tuple[str, int]], segment_size: int = 1 << 20) -> CommitLog:
    """A commit log with one record per (topic, queue id) of `queues`, offsets in log order."""
    log = CommitLog(directory / "commitlog", segment_size)
    assigned: dict[tuple[str, int], int] = {}
    for i, (topic, queue_id) in enumerate(queues):
        properties = {record.PROPERTY_KEYS: f"key{i % 17}", record.PROPERTY_UNIQ_KEY: f"UNIQ{i:012d}"}
        encoded = record.prepare(
            topic=topic,
            body=b"body-%d" % i,
            queue_id=queue_id,
            properties_bytes=record.encode_properties(properties),
            store_host=("127.0.0.1", 10911),
            born_host=("127.0.0.1", 0),
            born_timestamp=1_700_000_000_000 + i,
        )
        offset = assigned.get((topic, queue_id), 0)
        log.append(encoded, offset, 1_700_000_000_000 + i)
        assigned[(topic, queue_id)] = offset + 1
    return log


def mapped_files(pid: int, under: Path) -> list[str]:
    """The files under `under` that process `pid` has mapped, one entry a mapping."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line.split(maxsplit=5)[-1] for line in lines if str(under) in line]


def new_queues(root: Path, count: int) -> None:
    layout = [(f"n{i}", 0) for i in range(count) for _ in range(3)]
    log = build_log(root / "log", layout)
    builder = BatchBuilder(str(root / "cq"), 32, False)
    builder.build(cut_batch(log, 0, 0, log.write_position, 1 << 24)[0])
    builder.close()
    keys = [(f"n{i}", 0) for i in range(count)]
    queues = ConsumeQueue.adopted_many(root / "cq", 32, FrontierTable(count), keys, [0] * count, [3] * count)
    committed = len(mapped_files(os.getpid(), root / "cq"))
    assert all(len(cq.read(0, 10)) == 3 for cq in queues)
    read = len(mapped_files(os.getpid(), root / "cq"))
    print(f"new queues: {count} adopted and committed: {committed} files mapped; after a read of each: {read}")
    for cq in queues:
        cq.close()
    log.close()


def thread_alone(root: Path, budget: int) -> None:
    keys = [(f"t{i % 5}", i // 5 % 12) for i in range(3000)]  # 60 queues, 50 entries each
    log = build_log(root, keys)
    saved = consume_queue.MAPPINGS.budget
    consume_queue.MAPPINGS.budget = len(consume_queue.MAPPINGS) + 1000
    cqs = ConsumeQueueStore(root / "cq", 400)
    index = KeyIndex(root / "index", 64, 4000)
    dispatcher = ParallelDispatcher(log, cqs, index, 0, 0, batch_bytes=16 * 1024)
    builder = dispatcher.inline_builder()
    builder.max_queue_files = 16
    dispatcher.dispatch_until(log.write_position // 3)
    consume_queue.MAPPINGS.budget = budget
    try:
        assert all(len(cqs.get(*key).read(0, 1)) == 1 for key in set(keys))
        dispatcher.dispatch_until(log.write_position)
        mapped = len(mapped_files(os.getpid(), root / "cq"))
    finally:
        consume_queue.MAPPINGS.budget = saved
    print(
        f"thread alone: {len(set(keys))} known queues, queues' budget {budget}, builder's 16: "
        f"{mapped} files mapped at the end"
    )
    dispatcher.close()
    cqs.close()
    index.close()
    log.close()


def two_workers(root: Path) -> None:
    layout = [(f"t{i % 3}", (i // 3) % 40) for i in range(3000)]
    log = build_log(root, layout, 256 * 1024)
    cqs = ConsumeQueueStore(root / "cq", 64)
    index = KeyIndex(root / "index", 64, 200)
    dispatcher = ParallelDispatcher(log, cqs, index, 0, 2, batch_bytes=16 * 1024, inline_bytes=0)
    dispatcher.dispatch_until(log.write_position)
    queues = set(layout)
    for number, pid in enumerate(dispatcher.worker_pids()):
        mapped = set()
        for path in mapped_files(pid, root / "cq"):
            parts = path.split("/")
            mapped.add((parts[-3], int(parts[-2])))
        own = {key for key in queues if owner_of(*key, 2) == number}
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
        )
        heap = {name: environ.get(name) for name in MALLOC_ENV} == MALLOC_ENV
        print(
            f"worker {number}: maps {len(mapped & own)} of its {len(own)} queues and "
            f"{len(mapped - own)} of the other's {len(queues - own)}; "
            f"handovers forwarded {dispatcher.handovers_forwarded}; heap settings {'set' if heap else 'MISSING'}"
        )
    dispatcher.close()
    cqs.close()
    index.close()
    log.close()


def builder_state(root: Path, topics: int) -> None:
    builder = BatchBuilder(str(root / "cq"), 64, False)
    builder.owners = 2

    def entries() -> dict[str, int]:
        """The builder's non-empty containers and their sizes."""
        held = {name: len(value) for name, value in vars(builder).items() if isinstance(value, (dict, list, set))}
        return {name: size for name, size in held.items() if size}

    before = entries()
    log = build_log(root / "log", [(f"%LMQ%q{i}", 0) for i in range(topics)])
    offset = 0
    while offset < log.write_position:
        task, _ = cut_batch(log, 0, offset, log.write_position, 16 * 1024)
        builder.build(task)
        builder.close_queue_files()
        offset = task.end
    print(f"builder state: held before {before}, after batches of {topics} light-queue topics {entries()}")
    builder.close()
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to build (a temporary directory by default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        new_queues(root / "new", 200)
        thread_alone(root / "alone", 8)
        two_workers(root / "workers")
        builder_state(root / "state", 2000)


if __name__ == "__main__":
    main()
