"""Light message queues at scale (issue 45): the embedded store with N light queues.

    .venv/bin/python bench/lite.py [--queues N] [--full] [--dir DIR] [--keep]

In one run, over a store in a temporary directory on disk (async flush, the default dispatch):
1. fill: N messages, each multi-dispatched to its own light queue `%LMQ%q{i}` (N light queues
   with one message each), sent with `put_batch` 1,000 at a time; the send rate, and the rate
   until every unit is dispatched;
2. reads: `get` from 10,000 light queues drawn at random, each checked to hold its message;
3. baseline: min(N, 200,000) messages multi-dispatched to one light queue, and as many plain
   messages to a topic queue: the send rates against the fill's; then the same three in
   alternating rounds of 10,000, in this process's CPU time until dispatched (robust to the
   load of a shared machine): the ratio of the rates across light queues and to one (target:
   at least half);
4. fan-out: 2,000 messages each to 100 light queues against 2,000 to 1 (sends until
   dispatched);
5. memory and files: the process's RSS (anonymous: Python objects and heaps; file-backed:
   mapped pages of the log and the tables) before and after the fill, per idle light queue
   (target: at most 100 bytes), and the number of files in the store (target: not growing with
   N);
6. start-up: a fresh process opens the store after the clean stop (and, apart, the light queues'
   tables), and again after a process that sent 20,000 more light messages was killed with
   SIGKILL (target: under 2 s).
`--full` makes N 10,000,000 (default 1,000,000).  Run it at two sizes to see the scaling.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tidemq.store import Message, MessageStore, StoreConfig  # noqa: E402
from tidemq.store.light.kv import KvLightQueues  # noqa: E402

MULTI = "INNER_MULTI_DISPATCH"
BATCH = 1000


def memory() -> dict[str, int]:
    """This process's resident memory in bytes: VmRSS, RssAnon, RssFile."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found


def count_files(directory: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(directory))


def send(store: MessageStore, messages, total: int) -> tuple[float, float]:
    """Send `messages` (an iterator of batches); seconds until the last put returned, and until
    everything is dispatched."""
    start = time.perf_counter()
    for batch in messages:
        store.put_batch(batch)
    sent = time.perf_counter() - start
    if not store.wait_dispatched(timeout=3600):
        raise SystemExit("dispatch did not catch up within an hour")
    return sent, time.perf_counter() - start


def light_batches(names, count: int, body: bytes = b"m" * 64, topic: str = "parent"):
    for start in range(0, count, BATCH):
        yield [Message(topic=topic, body=body, properties={MULTI: names(i)}) for i in range(start, min(count, start + BATCH))]


def plain_batches(count: int, body: bytes = b"m" * 64, properties: dict[str, str] | None = None):
    for start in range(0, count, BATCH):
        yield [Message(topic="plain", body=body, properties=dict(properties or {})) for _ in range(start, min(count, start + BATCH))]


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s"


def open_in_child(directory: Path) -> dict:
    """Open the store in a fresh process: how long `MessageStore()` took, and its memory."""
    out = subprocess.run([sys.executable, __file__, "--child-open", str(directory)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_open(directory: Path) -> None:
    start = time.perf_counter()
    tables = KvLightQueues(directory / "lightqueue")
    tables_open = time.perf_counter() - start
    tables.close()
    before = memory()
    start = time.perf_counter()
    store = MessageStore(directory, StoreConfig())
    opened = time.perf_counter() - start
    after = memory()
    count = store.light_queues.count()
    probe = store.get("%LMQ%q0", 0, 0).messages
    store.close()
    print(json.dumps({"open_s": opened, "tables_open_s": tables_open, "rss_delta": after["VmRSS"] - before["VmRSS"], "light_queues": count,
                      "abnormal": store.recovery.abnormal, "redispatched_bytes": store.recovery.end - store.recovery.redispatched_from,
                      "probe": len(probe)}))


def child_send_and_wait(directory: Path, count: int) -> None:
    store = MessageStore(directory, StoreConfig())
    for batch in light_batches(lambda i: f"%LMQ%killed{i}", count):
        store.put_batch(batch)
    store.wait_dispatched(timeout=600)
    print("sent", flush=True)
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=1_000_000)
    parser.add_argument("--full", action="store_true", help="10,000,000 light queues")
    parser.add_argument("--dir", help="where to make the store (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the store directory")
    parser.add_argument("--child-open", help=argparse.SUPPRESS)
    parser.add_argument("--child-send", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_open:
        return child_open(Path(args.child_open))
    if args.child_send:
        return child_send_and_wait(Path(args.child_send), 20_000)
    n = 10_000_000 if args.full else args.queues
    root = Path(tempfile.mkdtemp(prefix="tidemq-lite-", dir=args.dir))
    directory = root / "store"
    try:
        run(directory, n)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(directory: Path, n: int) -> None:
    print(f"light queues: {n:,}, one message each; store in {directory}")
    store = MessageStore(directory, StoreConfig())
    empty_files = count_files(directory)
    before = memory()
    sent, done = send(store, light_batches(lambda i: f"%LMQ%q{i}", n), n)
    after = memory()
    fill_rate = n / sent
    print(f"fill: sent {rate(n, sent)} ({sent:.1f} s), dispatched {rate(n, done)} ({done:.1f} s)")
    anon = (after["RssAnon"] - before["RssAnon"]) / n
    total = (after["VmRSS"] - before["VmRSS"]) / n
    print(f"memory per idle light queue: {anon:.1f} bytes anonymous, {total:.1f} bytes of RSS with mapped pages "
          f"(RSS {after['VmRSS'] / 2**20:.0f} MiB: anonymous {after['RssAnon'] / 2**20:.0f}, file {after['RssFile'] / 2**20:.0f})")
    kv_bytes = sum(f.stat().st_size for f in (directory / "lightqueue").iterdir())
    print(f"files in the store: {count_files(directory)} (empty store: {empty_files}); tables {kv_bytes / n:.0f} bytes a queue on disk")

    rng = random.Random(45)
    sample = rng.sample(range(n), min(n, 10_000))
    start = time.perf_counter()
    for i in sample:
        got = store.get(f"%LMQ%q{i}", 0, 0)
        assert len(got.messages) == 1 and got.max_offset == 1, i
    reads = time.perf_counter() - start
    print(f"reads: {rate(len(sample), reads)} random light queues (get, record included)")

    base = min(n, 200_000)
    sent_one, done_one = send(store, light_batches(lambda i: "%LMQ%single", base), base)
    sent_plain, done_plain = send(store, plain_batches(base), base)
    print(f"one light queue: sent {rate(base, sent_one)}, dispatched {rate(base, done_one)}; "
          f"plain topic: sent {rate(base, sent_plain)}, dispatched {rate(base, done_plain)}")
    print(f"wall-clock ratio: sends across {n:,} light queues / to one light queue = {fill_rate / (base / sent_one):.2f}; "
          f"/ plain = {fill_rate / (base / sent_plain):.2f}; until dispatched: {(n / done) / (base / done_one):.2f}")
    # the same comparison in this process's CPU time, in alternating rounds (so that both sides
    # see the same load from the rest of the machine): new light queues beside the N, one light
    # queue, plain messages; each round until dispatched
    cpu = {"new light queues": 0.0, "one light queue": 0.0, "plain with a property": 0.0, "plain": 0.0}
    rounds, size = 5, 10_000
    for r in range(rounds):
        for kind in cpu:
            batches = (light_batches(lambda i, r=r: f"%LMQ%more{r}_{i}", size) if kind == "new light queues" else
                       light_batches(lambda i: "%LMQ%single", size) if kind == "one light queue" else
                       plain_batches(size, properties={"k": "v"}) if kind == "plain with a property" else plain_batches(size))
            before_cpu = time.process_time()
            send(store, batches, size)
            cpu[kind] += time.process_time() - before_cpu
    per = {kind: seconds / (rounds * size) * 1e6 for kind, seconds in cpu.items()}
    print("CPU a message until dispatched: " + ", ".join(f"{kind} {us:.1f} us" for kind, us in per.items()))
    print(f"CPU ratio (rate across light queues / rate to one light queue): {per['one light queue'] / per['new light queues']:.2f}; "
          f"/ plain with a property: {per['plain with a property'] / per['new light queues']:.2f}; "
          f"/ plain: {per['plain'] / per['new light queues']:.2f}")

    fan = 2_000
    hundred = [f"%LMQ%fan{k}" for k in range(100)]
    _, done_100 = send(store, light_batches(lambda i: ",".join(hundred), fan), fan)
    _, done_1 = send(store, light_batches(lambda i: "%LMQ%fan_one", fan), fan)
    print(f"fan-out: to 100 light queues {rate(fan, done_100)} messages ({rate(fan * 100, done_100)} units), "
          f"to 1: {rate(fan, done_1)}; ratio {done_100 / done_1:.1f}x the time")
    assert store.max_offset("%LMQ%fan99", 0) == fan
    store.close()

    clean = open_in_child(directory)
    print(f"start-up after a clean stop: {clean['open_s']:.2f} s ({clean['light_queues']:,} light queues, "
          f"RSS +{clean['rss_delta'] / 2**20:.0f} MiB); the light queues' tables alone open in "
          f"{clean['tables_open_s'] * 1000:.1f} ms")
    child = subprocess.Popen([sys.executable, __file__, "--child-send", str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "sent"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    killed = open_in_child(directory)
    assert killed["abnormal"]
    print(f"start-up after SIGKILL: {killed['open_s']:.2f} s (redispatched {killed['redispatched_bytes']:,} bytes of log; "
          f"{killed['light_queues']:,} light queues)")


if __name__ == "__main__":
    main()
