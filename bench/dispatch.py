"""Dispatch benchmark: parallel, order-preserving dispatch (RIP-52) with the key index on.

    .venv/bin/python bench/dispatch.py [--messages N] [--workers N] [--seconds S] [--dir DIR] [--cold-memory]

Prints figures and ratios from one run (the machine is shared with other engineers' tests, so
compare figures within a run, never across runs):

1. Throughput (entries/s) building the ConsumeQueues and the key index from one commit log per
   queue layout — 10 queues, 10,000 queues, one hot queue — with `ParallelDispatcher` building on
   the calling thread alone (0 workers, the store's `dispatch_workers = 0`), and with 1 and N
   worker processes (started before timing).
   The logs are written once; every build starts from empty index directories, and is preceded
   by touching and freeing WARM_BYTES of memory (see `warm_memory`; `--cold-memory` skips it)
   and by reading the log into the page cache (`cache_log`).  Each layout's rows: the files part
   (the first half of the log, which makes every queue's files), the steady part (the second
   half), and the whole log; then each round's ratio of N workers to 1 worker, as the best rates
   and the median of the rounds can disagree when one build of a layout catches a calm spell.
   After each round it also runs N 1-worker builds of the log side by side, each in a process of
   its own (`builds_together`): what the machine gives this work from N cores at the time.
   For the 10,000-queue layout it also times creating that many queue directories and files
   with one and with N plain processes: the kernel's share of the files part, and how far it
   scales.  It prints the CPU time the host took from this virtual machine during each build
   (steal), and runs a round again when its worker builds lost more than STEAL_LIMIT of the
   cores' time.
2. A sustained run: producer threads append as fast as they can (`put_batch` of 32, 128-byte
   bodies, 64 queues, a KEYS entry each) to a MessageStore with N dispatch workers; the dispatch
   lag (bytes and ms, per sink) is sampled every 100 ms and printed, with its largest value since
   the line before, every few seconds.

Start it several minutes after anything deleted many files on the same file system (an earlier
run's cleanup, a test run's temporary directories): ext4 without a journal, as here, skips inodes
freed in the last minute (the last six while their inode-table block is dirty) when it allocates
one, looking at each in turn, and creating the 10,000-queue layout's files was then up to 10x
slower (perf: `recently_deleted`).  Creating them with one plain process took 2.2 s right after
deleting 40,000 files and directories, 0.19-0.24 s on a quiet file system; deleting an earlier
scratch run's directories just before the builds made 2 workers' files part use 2.3 CPU-s
instead of 1.2.  The run deletes nothing between its timed builds (see `throughput`).

Targets (issue 4): N = 2 workers on a 2-core machine >= 1.7x one worker; under maximum append
load the lag stays bounded (the second half of the run is not worse than the first).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidemq.store import Message, MessageStore, StoreConfig, record  # noqa: E402
from tidemq.store.dispatch.parallel import ParallelDispatcher  # noqa: E402
from tidemq.store.index.key_index import KeyIndex  # noqa: E402
from tidemq.store.log.commit_log import CommitLog  # noqa: E402
from tidemq.store.queues.queue_set import ConsumeQueueStore, spread_topic_directories  # noqa: E402

SEGMENT = 256 << 20
UNITS = 20_000  # 400 KB consume-queue files: 10,000 queues stay light on mappings
INDEX_SLOTS = 1_000_000
INDEX_ENTRIES = 4_000_000
SAMPLE_SECONDS = 0.1  # the sustained run's lag samples: one every 5 s caught a 100-160 ms peak by chance
# Memory touched and freed before each timed build (`warm_memory`): more than a build's new
# queue-file, index-file and heap pages (about 300 MB for 2 x 2,000,000 records)
WARM_BYTES = 1 << 30
WARM_MEMORY = True  # --cold-memory: False
# a round whose 1- and N-worker builds lost more than this share of the cores' time to the host
# (steal: the machine is a virtual machine on a shared host) is run again, up to `rounds` times:
# in one run 2 workers' builds lost 0.24-1.05 CPU-s each, a third of a 2-worker build's time
STEAL_LIMIT = 0.03


def write_log(directory: Path, count: int, queue_of) -> CommitLog:
    log = CommitLog(directory / "commitlog", SEGMENT)
    body = os.urandom(100)
    assigned: dict[tuple[str, int], int] = {}
    now = int(time.time() * 1000)
    prepare = record.prepare
    for i in range(count):
        topic, queue_id = queue_of(i)
        properties = record.encode_properties(
            {record.PROPERTY_TAGS: f"tag{i % 8}", record.PROPERTY_KEYS: f"order{i}",
             record.PROPERTY_UNIQ_KEY: f"7F000001{os.getpid() & 0xFFFF:04X}0000{i:016X}"}
        )
        encoded = prepare(topic=topic, body=body, queue_id=queue_id, properties_bytes=properties,
                          store_host=("127.0.0.1", 10911), born_host=("127.0.0.1", 0), born_timestamp=now)
        key = (topic, queue_id)
        offset = assigned.get(key, 0)
        log.append(encoded, offset, now + i // 1000)
        assigned[key] = offset + 1
    return log


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), 0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def warm_memory(size: int) -> None:
    """Touch `size` bytes of fresh memory and free them, so that the pages a build then takes
    for its files are pages the machine has just used.  This machine is a virtual machine that
    hands free memory back to its host after a few seconds (free page reporting): the guest's
    first write to such a page faults in the host, and two processes doing it at once were, in
    some runs, slower together than one alone (`memory_parallelism`: 0.53-1.09x in three runs,
    1.36-1.75x on memory just freed), which made 2 workers' builds up to twice as slow from one
    run to the next.  A long-running store reuses the memory of its page cache and does not
    meet this."""
    area = mmap.mmap(-1, size)
    np.frombuffer(area, np.uint8)[:: mmap.PAGESIZE] = 1
    area.close()


def cache_log(log: CommitLog) -> None:
    """Read the log's segments, so that a build finds them in the page cache, as dispatch in a
    store finds the records just appended.  This machine pages out page-cache pages that no
    process has mapped and that were not read for about 30 s (a DAMON `pageout` scheme, kdamond),
    and a layout's log is written once for all its rounds: without this, later builds read a
    growing share of the log from disk (12-36% of a 1.1 GB log's pages were gone after a few
    minutes of builds, fincore), and the coordinator's search for batch boundaries and the
    workers' walks waited on it (perf: their faults in `filemap_fault` sleeping on the read)."""
    chunk = bytearray(8 << 20)
    for segment in sorted(p for p in log.directory.iterdir() if p.name.isdigit()):
        with open(segment, "rb", buffering=0) as f:
            while f.readinto(chunk):
                pass


def _machine_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has used, CPU seconds the host took from this
    virtual machine: steal) so far (Linux /proc/stat), 0 where unavailable.  Stolen time is time a
    core of ours was ready to run and the host ran something else: a build then takes longer for
    no fault of its own."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
        # user, nice, system, idle, iowait, irq, softirq, steal: all but idle, iowait and steal
        return (sum(fields) - fields[3] - fields[4] - fields[7]) / tick, fields[7] / tick
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


# workers -> [worker CPU seconds, coordinator CPU seconds, CPU seconds of other processes, wall seconds,
# CPU seconds stolen by the host] summed
CPU_USED: dict[int, list[float]] = {}
# (layout, workers) -> per build, per part: (CPU seconds of the workers, of the coordinator)
PART_CPU: dict[tuple[str, int], list[tuple[tuple[float, float], tuple[float, float]]]] = {}
# (layout, workers) -> per build: CPU seconds the host took from this machine (steal)
STOLEN: dict[tuple[str, int], list[float]] = {}


def build(log: CommitLog, out: Path, workers: int, middle: int, layout: str = "",
          before_timing: Callable[[], None] | None = None) -> tuple[float, float, int]:
    """Dispatch the log into empty indexes in two timed parts, [start, middle) — which creates
    every queue's files — and [middle, end) — the steady state, files in place; workers 0 = on
    this thread alone.  Returns (seconds first part, seconds second part, entries); the CPU time
    of each part goes to PART_CPU[layout, workers].  `out` is left in place: see `throughput`.
    `before_timing` is called once everything is set up, just before the timing starts."""
    shutil.rmtree(out, ignore_errors=True)
    queues = ConsumeQueueStore(out / "consumequeue", UNITS)
    index = KeyIndex(out / "index", INDEX_SLOTS, INDEX_ENTRIES)
    dispatcher = ParallelDispatcher(log, queues, index, log.min_offset, workers)
    dispatcher.wait_ready()  # interpreter start and imports stay out of the timing
    dispatcher.inline_bytes = 0
    pids = dispatcher.worker_pids()
    os.sync()  # the kernel's writeback of the log and of earlier runs stays out of the timing
    if WARM_MEMORY:
        warm_memory(WARM_BYTES)
    cache_log(log)
    if before_timing is not None:
        before_timing()
    cpu_before = sum(_cpu_seconds(p) for p in pids)
    own_before = time.process_time()
    machine_before, stolen_before = _machine_seconds()
    start = time.perf_counter()
    entries = dispatcher.dispatch_until(middle)
    first = time.perf_counter() - start
    cpu_middle = sum(_cpu_seconds(p) for p in pids)
    own_middle = time.process_time()
    start = time.perf_counter()
    entries += dispatcher.dispatch_until(log.write_position)
    second = time.perf_counter() - start
    worker_cpu = sum(_cpu_seconds(p) for p in pids) - cpu_before
    own_cpu = time.process_time() - own_before
    PART_CPU.setdefault((layout, workers), []).append(
        ((cpu_middle - cpu_before, own_middle - own_before), (worker_cpu - cpu_middle + cpu_before, own_cpu - own_middle + own_before)))
    used = CPU_USED.setdefault(workers, [0.0, 0.0, 0.0, 0.0, 0.0])
    machine_after, stolen_after = _machine_seconds()
    used[0] += worker_cpu
    used[1] += own_cpu
    used[2] += max(0.0, machine_after - machine_before - worker_cpu - own_cpu)
    used[3] += first + second
    used[4] += stolen_after - stolen_before
    STOLEN.setdefault((layout, workers), []).append(stolen_after - stolen_before)
    dispatcher.close()
    queues.close()
    index.close()
    return first, second, entries


def throughput(root: Path, count: int, workers: int, rounds: int) -> None:
    layouts = {  # name: (queue of record i, whether the queue files are many)
        "10 queues": (lambda i: ("bench", i % 10), False),
        "10,000 queues": (lambda i: (f"bench{i % 10}", (i // 10) % 1000), True),
        "one hot queue": (lambda i: ("hot", 0), False),
    }
    print("1. dispatch throughput (entries/s), key index on (UNIQ_KEY + 1 KEYS entry per record);")
    print(f"   each log holds 2 x {count:,} records: the first half creates the queue files, the second")
    print("   half is the steady state; 'whole' is the whole log, both parts.  'thread' builds on the dispatch")
    print("   thread alone (0 workers).  Dirty pages are written back (sync) before each build, outside the timing.")
    print(f"   Best of {rounds} interleaved rounds; 'N/1 workers' compares the best rates, 'paired' is the median")
    print("   over the rounds of N workers' rate against 1 worker's in the same round (one round's builds run")
    print("   back to back, 1 and N workers going first in turn: a slow spell of the machine hits both sides of a")
    print("   pair; each round's ratio is printed under the layout, as the two statistics can disagree).")
    print(f"   'machine' is the median over the same rounds of what {workers} plain CPU-bound processes get done")
    print("   against one (measured after each round's builds): the most any parallel work could reach on this")
    print("   machine then.")
    print(f"   '{workers} builds' (whole log) is the median over the rounds of what {workers} 1-worker builds of the same log, each")
    print("   in a process of its own into files of its own, started together after each round's builds, got done")
    print("   against that round's 1 worker (the sum of their rates, high where one ends first): what the machine")
    print(f"   gave this very work from {workers} cores then, with nothing shared between the builds and no coordination")
    print("   to pay for.  The work line under each layout gives the CPU time its parts took: N workers reach N/1")
    print("   only where they do no more work than 1, and their coordinator shares their cores (1 worker's has a")
    print("   core to itself).")
    print(f"   A round whose worker builds lost more than {STEAL_LIMIT:.0%} of the cores' time to the host (steal: this is")
    print(f"   a virtual machine on a shared host) is run again, up to {rounds} times a layout.")
    header = (f"   {'layout':<15}{'part':<8}{'thread':>12}{'1 worker':>12}{f'{workers} workers':>12}{'N/1 workers':>13}"
              f"{'paired':>9}{'machine':>9}{f'{workers} builds':>10}")
    print(header)
    for name, (queue_of, many_files) in layouts.items():
        tag = name.split()[0].replace(",", "")
        log_dir = root / f"log-{tag}"
        log = write_log(log_dir, 2 * count, queue_of)
        middle, first_entries = _walk(log, log.write_position // 2)
        rates: dict[int, tuple[float, float, float]] = {}  # per worker count, the best rates: files, steady, whole
        pairs: list[tuple[float, float, float]] = []  # per round, N workers' rates / 1 worker's, per part and whole
        machine: list[float] = []
        side_by_side: list[float] = []  # per round, N 1-worker builds side by side against 1 worker alone (whole log)
        file_system: list[tuple[float, float]] = []
        kept, attempt, retried = 0, 0, 0
        while kept < rounds:  # interleaved, best of `rounds`: other load on the machine hits all alike
            n = attempt
            attempt += 1
            times = {}
            stolen, wall = 0.0, 0.0
            # the 1-worker and N-worker builds take turns going first, so that neither always
            # follows the same build (its dirty pages, the memory it freed)
            for w in ((0, 1, workers) if n % 2 == 0 else (0, workers, 1)):
                # each build gets a new directory, deleted after the layout's last build, its
                # queue files (many files) after the last layout's: nothing is deleted between
                # timed builds.  ext4 without a journal skips inodes freed in the last minute when
                # it allocates one, scanning past them from the start of the block group each
                # time, so deleting a build's 20,000 queue files and directories made creating
                # them in the next build up to 10x slower (1 ms a queue instead of 0.1) than on a
                # store that never deleted any; and a file system mounted with online discard
                # works on freed blocks after the delete, which took CPU from the next build (from
                # 2 workers' more than from 1 worker's, who leaves a core idle)
                out = root / f"out-{tag}-{n}-{w}"
                first, second, entries = build(log, out, w, middle, name)
                assert entries == 2 * count, (entries, count)
                times[w] = (first, second)
                if w:
                    stolen += STOLEN[name, w][-1]
                    wall += first + second
            if stolen > STEAL_LIMIT * wall * (os.cpu_count() or 1) and retried < rounds:
                retried += 1  # the host took the cores: this round compares nothing of ours
                for w in (0, 1, workers):
                    PART_CPU[name, w].pop()
                    STOLEN[name, w].pop()
                continue
            kept += 1
            for w, (first, second) in times.items():
                best = rates.get(w, (0.0, 0.0, 0.0))
                rates[w] = (max(best[0], first_entries / first), max(best[1], (entries - first_entries) / second),
                            max(best[2], entries / (first + second)))
            pairs.append((times[1][0] / times[workers][0], times[1][1] / times[workers][1], sum(times[1]) / sum(times[workers])))
            machine.append(machine_parallelism(workers))
            together = builds_together(log, [root / f"out-{tag}-{n}-apart{k}" for k in range(workers)], middle)
            side_by_side.append(sum(sum(times[1]) / (first + second) for first, second in together))
            if many_files:
                file_system.append(file_system_parallelism(root / f"out-{tag}-{n}-fs", workers))
        if retried:
            print(f"   {name}: {retried} round(s) run again: the host took more than {STEAL_LIMIT:.0%} of the cores' time "
                  f"during their worker builds (steal)")
        parts = ("files", "steady", "whole")  # the rows, in the order of each rate and pair tuple
        for i, part in enumerate(parts):
            r = {w: rates[w][i] for w in rates}
            paired = statistics.median(p[i] for p in pairs)
            print(f"   {name if i == 0 else '':<15}{part:<8}{r[0]:>12,.0f}{r[1]:>12,.0f}{r[workers]:>12,.0f}{r[workers] / r[1]:>12.2f}x"
                  f"{paired:>8.2f}x{statistics.median(machine):>8.2f}x" + (f"{statistics.median(side_by_side):>9.2f}x" if i == 2 else ""))
        spread = "; ".join(f"{part} {' '.join(f'{p[i]:.2f}' for p in pairs)}" for i, part in enumerate(parts))
        print(f"   {'':<15}(paired, each round: {spread};")
        print(f"   {'':<15}{workers} builds side by side, each round: {' '.join(f'{x:.2f}' for x in side_by_side)})")
        work = {}  # part -> per worker count, median CPU-s of the workers and of the coordinator
        for i, part in enumerate(parts[:2]):  # the work of each part (the whole is their sum)
            work[part] = ", ".join(
                f"{statistics.median(b[i][0] for b in PART_CPU[name, w]):.2f} + {statistics.median(b[i][1] for b in PART_CPU[name, w]):.2f}"
                f" ({w} worker{'s' if w > 1 else ''})" for w in (1, workers))
        print(f"   {'':<15}(work, median CPU-s of the workers + the coordinator: files {work['files']};")
        print(f"   {'':<15}steady {work['steady']})")
        stolen = ", ".join(f"{w} worker{'s' if w > 1 else ''} {' '.join(f'{x:.2f}' for x in STOLEN[name, w])}" for w in (1, workers))
        print(f"   {'':<15}(CPU-s the host took from this machine during each round's build, steal: {stolen})")
        if file_system:
            one, many = statistics.median(t[0] for t in file_system), statistics.median(t[1] for t in file_system)
            print(f"   {'':<15}(creating the 10,000 queues' directories and files alone, after each round: 1 process")
            print(f"   {'':<15}{one:.2f} s, {workers} processes {many:.2f} s, {one / many:.2f}x, medians: the most the files part")
            print(f"   {'':<15}could gain from {workers} workers where creating its files is most of its work)")
        log.close()
        shutil.rmtree(log_dir, ignore_errors=True)
        for out in root.glob(f"out-{tag}-*"):
            shutil.rmtree(out / "index" if many_files else out, ignore_errors=True)
    for out in root.glob("out-*"):
        shutil.rmtree(out, ignore_errors=True)
    for w, (cpu, own, other, wall, stolen) in sorted(CPU_USED.items()):
        print(f"   {w} worker(s): in {wall:.1f} s of dispatch the workers used {cpu:.1f} CPU-s ({cpu / wall:.2f} cores "
              f"busy on average), the coordinator {own:.1f} ({own / wall:.2f}), the rest of the machine {other:.1f} ({other / wall:.2f}: other "
              f"processes, kernel threads); the host took {stolen:.1f} CPU-s ({stolen / wall:.2f} cores: steal)")
    print(f"   load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other engineers' work included)")


def _walk(log: CommitLog, near: int) -> tuple[int, int]:
    """(the first record boundary at or after `near`, the records below it), walking the log from
    its start across segments: a blank filler ends its segment, and the walk goes on at the next
    segment's start."""
    offset, count = log.min_offset, 0
    while offset < near:
        rec = log.read_record(offset, check_crc=False, read_body=False, read_properties=False)
        if type(rec) is record.EndOfSegment:
            offset = log.next_segment_start(offset)
        elif type(rec) is record.Record:
            offset += rec.total_size
            count += 1
        else:
            break  # the end of the data
    return offset, count


def sustained(root: Path, seconds: float, workers: int, producers: int) -> None:
    directory = root / "sustained"
    cfg = StoreConfig(segment_size=SEGMENT, consume_queue_units=UNITS, dispatch_workers=workers,
                      index_hash_slots=INDEX_SLOTS, index_max_entries=INDEX_ENTRIES)
    print(f"\n2. {seconds:.0f} s of maximum append load: {producers} producer threads, put_batch of 32, "
          f"{workers} dispatch workers")
    body = os.urandom(128)
    stop = threading.Event()
    put_counts = [0] * producers
    with MessageStore(directory, cfg) as store:
        store.dispatcher.wait_ready()

        def produce(n: int) -> None:
            i = 0
            while not stop.is_set():
                batch = [Message(topic="load", body=body, queue_id=(i + k) % 64, keys=[f"p{n}-{i + k}"]) for k in range(32)]
                store.put_batch(batch)
                i += 32
                put_counts[n] = i

        threads = [threading.Thread(target=produce, args=(n,), daemon=True) for n in range(producers)]
        start = time.monotonic()
        for t in threads:
            t.start()
        samples = []  # (seconds since start, lag ms), every SAMPLE_SECONDS
        last_total, last_time = 0, start
        interval = max(1.0, seconds / 12)
        print(f"   the lag is sampled every {SAMPLE_SECONDS * 1000:.0f} ms; each line gives the last sample and the")
        print("   largest since the line before")
        print(f"   {'t (s)':>6}{'appended/s':>13}{'lag bytes':>12}{'lag ms':>9}{'max ms':>9}   per sink (bytes, ms)")
        while time.monotonic() - start < seconds:
            interval_max = 0
            while time.monotonic() - last_time < interval:
                time.sleep(SAMPLE_SECONDS)
                lag = store.dispatch_lag()
                samples.append((time.monotonic() - start, lag.milliseconds))
                interval_max = max(interval_max, lag.milliseconds)
            now = time.monotonic()
            total = sum(put_counts)
            rate = (total - last_total) / (now - last_time)
            last_total, last_time = total, now
            print(f"   {now - start:>6.1f}{rate:>13,.0f}{lag.bytes:>12,}{lag.milliseconds:>9,}{interval_max:>9,}   {lag.sinks}")
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        total = sum(put_counts)
        caught_up = time.monotonic()
        store.wait_dispatched(300)
        drain = time.monotonic() - caught_up
        first = [s for s in samples if s[0] <= seconds / 2]
        second = [s for s in samples if s[0] > seconds / 2]
        max_first = max((s[1] for s in first), default=0)
        max_second = max((s[1] for s in second), default=0)
        print(f"   appended {total:,} messages in {elapsed:.1f} s ({total / elapsed:,.0f}/s); "
              f"drained the rest in {drain:.2f} s after the producers stopped")
        print(f"   max lag over {len(samples):,} samples: first half {max_first:,} ms, second half {max_second:,} ms "
              f"({'bounded' if max_second <= max(2 * max_first, 1000) else 'GROWING'})")
    shutil.rmtree(directory, ignore_errors=True)


def file_system_parallelism(directory: Path, n: int) -> tuple[float, float]:
    """What creating the 10,000-queue layout's queue directories and files (the work the files
    part adds, all in the kernel) gets from n processes: (seconds for one process to create them,
    seconds for n processes each creating those of its share of the topics).  Process k of n takes
    the k-th run of consecutive topics, as worker k of n starts k/n of the way through its queues
    ordered by topic (`BatchBuilder._rotated`), in a directory marked as the store marks its
    ConsumeQueue directory (`spread_topic_directories`), so that the topics' directories lie in
    different block groups.  Nothing is deleted here: `throughput` deletes `directory` with the
    builds' files."""
    code = (
        "import os, sys\n"
        "root, share, shares, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])\n"
        "for i in range(10_000):\n"
        "    if (i % 10) * shares // 10 == share:\n"
        "        queue = f'{root}/bench{i % 10}/{(i // 10) % 1000}'\n"
        "        os.makedirs(queue)\n"
        "        fd = os.open(queue + '/00000000000000000000', os.O_RDWR | os.O_CREAT, 0o644)\n"
        "        os.ftruncate(fd, size)\n"
        "        os.close(fd)\n"
    )

    def run(k: int) -> float:
        target = directory / f"{k}-processes"
        target.mkdir(parents=True)
        spread_topic_directories(target)
        return _run_together([[code, str(target), str(share), str(k), str(UNITS * 20)] for share in range(k)])

    return run(1), run(n)


def builds_together(log: CommitLog, outs: list[Path], middle: int) -> list[tuple[float, float]]:
    """(seconds files part, seconds steady part) of 1-worker builds of `log` (see `build`), one
    into each of `outs`, each run by a process of its own (`--build-child`): all are set up first,
    then told to start at once.  Two of them side by side is the build itself asked twice of the
    machine at once, with nothing shared between the two: what the machine gives this very work
    from a second core right then, beside which the plain CPU-bound processes of
    `machine_parallelism` can say little (1 worker's steady part took 1.2 to 2.3 CPU-s for the same
    records within an hour, while those processes read 1.5-2.0x).  Where one build ends first, the
    other runs its rest alone: the sum of their rates leans high."""
    command = [sys.executable, __file__, *([] if WARM_MEMORY else ["--cold-memory"]), "--build-child", str(log.directory),
               str(log.write_position), str(middle)]
    procs = [subprocess.Popen([*command, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for out in outs]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a benchmark build process failed before its build ({proc.wait()})")
        for proc in procs:
            proc.stdin.write("start\n")
            proc.stdin.flush()
        times = []
        for proc in procs:
            line = proc.stdout.readline().split()
            if len(line) != 2:
                raise RuntimeError(f"a benchmark build process failed in its build ({proc.wait()})")
            times.append((float(line[0]), float(line[1])))
        return times
    except BaseException:
        for proc in procs:  # the others would build on their closed stdin: stop them (their workers follow)
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait()


def _child_build(log_directory: str, write_position: str, middle: str, out: str) -> None:
    """One build of `builds_together`, in this process: prints 'ready' once set up, builds when a
    line comes on stdin, then prints its two parts' seconds."""

    def wait_for_start() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    log = CommitLog(Path(log_directory), SEGMENT)
    log.write_position = int(write_position)
    first, second, _ = build(log, Path(out), 1, int(middle), before_timing=wait_for_start)
    print(f"{first} {second}", flush=True)
    log.close()


def _run_together(programs: list[list[str]]) -> float:
    """Wall seconds for `python -c program args...` processes, one per item, run side by side."""
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", *program]) for program in programs]
    for proc, program in zip(procs, programs):
        if proc.wait():
            raise RuntimeError(f"a benchmark helper process failed ({proc.returncode}): {' '.join(program[1:])}")
    return time.perf_counter() - start


def machine_parallelism(n: int) -> float:
    """How many cores this machine gives us right now: n x (time of one busy process) / (time of
    n concurrent ones).  n on an idle machine; less when other work holds the cores."""
    code = "s = 0\nfor i in range(6_000_000): s += i"

    def run(k: int) -> float:
        return _run_together([[code]] * k)

    return n * min(run(1), run(1)) / min(run(n), run(n))  # the better of two each: a stray spell spoils one


def memory_parallelism(n: int, size: int = 1 << 30, settle: float = 6.0) -> tuple[float, float]:
    """(seconds for one process to first-touch `size` bytes of fresh memory, what n processes
    doing it at once get done against one), after `settle` seconds idle each, in which the memory
    freed before goes back to the host (see `warm_memory`)."""
    code = ("import mmap, sys\n"
            "area = mmap.mmap(-1, int(sys.argv[1]))\n"
            "for i in range(0, len(area), mmap.PAGESIZE): area[i] = 1\n")
    time.sleep(settle)
    one = _run_together([[code, str(size)]])
    time.sleep(settle)
    return one, n * one / _run_together([[code, str(size)]] * n)


def main() -> None:
    parser = argparse.ArgumentParser()
    # records per half of each log: 2,000,000 makes each timed part 0.2-0.4 s (500,000 made it
    # 50-100 ms, where a stray millisecond of the shared machine moved a ratio by several
    # percent), and each half fills one index file (INDEX_ENTRIES), as a store does every 2
    # million messages, so that the figures include its rollover
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to make the run's scratch directory (removed at the end)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-sustained", action="store_true")
    parser.add_argument("--cold-memory", action="store_true", help="do not warm memory before each build (see warm_memory)")
    parser.add_argument("--build-child", nargs=4, help=argparse.SUPPRESS)  # one build of builds_together
    args = parser.parse_args()
    global WARM_MEMORY
    WARM_MEMORY = not args.cold_memory
    if args.build_child:
        _child_build(*args.build_child)
        return
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    # a directory of its own, even inside --dir: only it is removed at the end
    root = Path(tempfile.mkdtemp(prefix="tidemq-bench-dispatch-", dir=args.dir))
    print(f"tidemq dispatch benchmark: {os.cpu_count()} cores, figures from this run only (shared machine)")
    try:
        if not args.skip_throughput:
            before = machine_parallelism(args.workers)
            print(f"   cores available to {args.workers} busy processes right now: {before:.2f} (ideal {args.workers})")
            touch, scaling = memory_parallelism(args.workers)
            print(f"   first writes to memory the machine has not used for 6 s: 1 GiB takes one process {touch:.2f} s; "
                  f"{args.workers} processes at once get {scaling:.2f}x that done")
            print(f"   (so each build is preceded by warming {WARM_BYTES >> 20} MiB of memory"
                  f"{', skipped: --cold-memory' if args.cold_memory else ''}; see warm_memory)")
            throughput(root, args.messages, args.workers, args.rounds)
            after = machine_parallelism(args.workers)
            print(f"   cores available to {args.workers} busy processes after the runs: {after:.2f}")
        if not args.skip_sustained:
            sustained(root, args.seconds, args.workers, args.producers)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
