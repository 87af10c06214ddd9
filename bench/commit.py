"""Commit benchmark: what the dispatch thread pays to commit a parallel-dispatch batch's runs of
slots (`queue_commit.QueueCommitter.commit`) as the store's queues grow to a million.

    .venv/bin/python bench/commit.py [--queues N] [--batch N] [--dir DIR]

Queues are started in batches of `--batch` new ones (one topic each, as light message queues are),
up to each size in turn; then, at each size, it times commits of batches of `--batch` known queues
(each run at its queue's frontier, the common case) and of the same with one new queue among them,
and prints the median of each and their ratio.  The ratio is the point: starting one queue must not
cost the batch much more than the queues it names (it once meant sorting every queue's code again:
at a million queues, 179 ms against 42 without the new queue, 4.2x).  Compare figures within a run
only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidemq.store.dispatch import ConsumeQueueStore  # noqa: E402
from tidemq.store.dispatch_messages import QueueRuns  # noqa: E402
from tidemq.store.queue_commit import QueueCommitter  # noqa: E402

ROUNDS = 15


def _runs(names: list[str], firsts: list[int]) -> QueueRuns:
    n = len(names)
    return QueueRuns(names, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.array(firsts, np.int64), np.ones(n, np.int64), {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = ConsumeQueueStore(Path(tmp) / "consumequeue", 1000)  # no file is made: they are mapped when first read
        committer = QueueCommitter(store)
        frontier: dict[str, int] = {}  # the next slot of each queue started
        made = 0  # queues %LMQ%q0 .. q{made - 1} started
        rng = np.random.default_rng(7)
        print(f"commit of a batch of {args.batch:,} known queues, alone and with one new queue (median of {ROUNDS}):")
        print(f"{'queues':>11} {'known only':>12} {'one new':>12} {'ratio':>7}   (starting {args.batch:,} at a time: ms a batch)")
        size = args.batch
        while size <= args.queues:
            started = time.perf_counter()
            batches = 0
            while made < size:
                names = [f"%LMQ%q{made + i}" for i in range(min(args.batch, size - made))]
                committer.commit(_runs(names, [0] * len(names)), {}, False)
                frontier.update((name, 1) for name in names)
                made += len(names)
                batches += 1
            starting = (time.perf_counter() - started) / max(batches, 1)
            known, with_new = [], []
            for r in range(ROUNDS):
                for times, new in ((known, False), (with_new, True)):
                    picked = [f"%LMQ%q{i}" for i in rng.choice(made, size=args.batch, replace=False).tolist()]
                    if new:
                        picked[-1] = f"%LMQ%new{len(frontier)}"
                    runs = _runs(picked, [frontier.get(name, 0) for name in picked])
                    t = time.perf_counter()
                    committer.commit(runs, {}, False)
                    times.append(time.perf_counter() - t)
                    for name in picked:
                        frontier[name] = frontier.get(name, 0) + 1
            a, b = statistics.median(known) * 1e3, statistics.median(with_new) * 1e3
            print(f"{size:>11,} {a:>9.2f} ms {b:>9.2f} ms {b / a:>6.2f}x   ({starting * 1e3:.0f})", flush=True)
            size *= 10


if __name__ == "__main__":
    main()
