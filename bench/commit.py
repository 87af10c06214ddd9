"""Commit benchmark: what the dispatch thread pays to commit a parallel-dispatch batch's runs of
slots (`queue_commit.QueueCommitter.commit`) as the store's queues grow to a million.

    .venv/bin/python bench/commit.py [--queues N] [--batch N] [--dir DIR]

Queues are started in batches of `--batch` new ones (one topic each, as light message queues are),
up to each size in turn; then, at each size, it times commits of batches of `--batch` known queues
(each run at its queue's frontier, the common case) and of the same with one new queue among them,
and prints the median of each and their ratio; and what starting queues costs: the time of a batch
of `--batch` new ones, and the memory each queue started holds (the growth of the process's
resident set over the queues started so far: the queue objects, the store's and committer's
tables, and the allocator's overhead).  The ratio is the point: starting one queue must not
cost the batch much more than the queues it names (it once meant sorting every queue's code again:
at a million queues, 179 ms against 42 without the new queue, 4.2x).  Compare figures within a run
only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidemq.store.dispatch.commit import QueueCommitter  # noqa: E402
from tidemq.store.dispatch.messages import QueueRuns  # noqa: E402
from tidemq.store.queues.queue_set import ConsumeQueueStore  # noqa: E402

ROUNDS = 15


def _runs(names: list[str], firsts: list[int]) -> QueueRuns:
    n = len(names)
    return QueueRuns(names, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.array(firsts, np.int64), np.ones(n, np.int64), {})


def _resident_bytes() -> int:
    """The process's resident set (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = ConsumeQueueStore(Path(tmp) / "consumequeue", 1000)  # no file is made: they are mapped when first read
        committer = QueueCommitter(store)
        # the next slot of each queue started: %LMQ%q{i} in an array (a dict of a million names
        # would grow the resident set as much as the store), the one-new queues in a dict
        frontier = np.zeros(args.queues + 1, dtype=np.int64)
        new_frontier: dict[str, int] = {}
        made = 0  # queues %LMQ%q0 .. q{made - 1} started
        resident = _resident_bytes()
        rng = np.random.default_rng(7)
        print(f"commit of a batch of {args.batch:,} known queues, alone and with one new queue (median of {ROUNDS}):")
        print(f"{'queues':>11} {'known only':>12} {'one new':>12} {'ratio':>7}   (starting {args.batch:,} at a time: ms a batch; memory a queue)")
        size = args.batch
        while size <= args.queues:
            started = time.perf_counter()
            batches = 0
            while made < size:
                names = [f"%LMQ%q{made + i}" for i in range(min(args.batch, size - made))]
                committer.commit(_runs(names, [0] * len(names)), {}, False)
                frontier[made : made + len(names)] = 1
                made += len(names)
                batches += 1
            starting = (time.perf_counter() - started) / max(batches, 1)
            per_queue = (_resident_bytes() - resident) / made
            known, with_new = [], []
            for r in range(ROUNDS):
                for times, new in ((known, False), (with_new, True)):
                    picked = rng.choice(made, size=args.batch, replace=False)
                    names = [f"%LMQ%q{i}" for i in picked.tolist()]
                    firsts = frontier[picked].tolist()
                    if new:
                        names[-1] = f"%LMQ%new{len(new_frontier)}"
                        firsts[-1] = 0
                        new_frontier[names[-1]] = 1
                    runs = _runs(names, firsts)
                    t = time.perf_counter()
                    committer.commit(runs, {}, False)
                    times.append(time.perf_counter() - t)
                    frontier[picked[:-1] if new else picked] += 1
            a, b = statistics.median(known) * 1e3, statistics.median(with_new) * 1e3
            print(f"{size:>11,} {a:>9.2f} ms {b:>9.2f} ms {b / a:>6.2f}x   ({starting * 1e3:.0f} ms; {per_queue:,.0f} bytes)",
                  flush=True)
            size *= 10


if __name__ == "__main__":
    main()
