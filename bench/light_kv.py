"""The measurement behind the light queues' key-value engine (docs/light-queues.md): N light
queues' units put into each candidate engine from Python, as dispatch puts them (10,000 a
transaction or write batch), then the engine reopened and 10,000 random units read.

    .venv/bin/python bench/light_kv.py [--keys N] [--engines lmdb,rocksdict]

Engines not installed are skipped (`pip install rocksdict` to compare RocksDB).  Two key
shapes: by name (`%LMQ%q{i}` + offset, random order: what a table keyed by queue name gets) and
by queue number (u64 + offset, increasing: what tidemq's units table gets, numbers handed out in
order).  Prints puts a second, reopen time, random reads a second, files and bytes on disk a key.
"""

import argparse
import os
import random
import shutil
import struct
import tempfile
import time

UNIT = struct.Struct(">qiqq")


def disk(directory: str) -> tuple[int, int]:
    files = [os.path.join(p, f) for p, _, names in os.walk(directory) for f in names]
    return len(files), sum(os.path.getsize(f) for f in files)


def run_lmdb(directory: str, keys: list[bytes], value: bytes, sample: list[bytes]) -> tuple[float, float, float]:
    import lmdb

    env = lmdb.open(directory, map_size=1 << 36, sync=False, metasync=False, max_dbs=2, readahead=False)
    db = env.open_db(b"units")
    start = time.perf_counter()
    for i in range(0, len(keys), 10_000):
        with env.begin(write=True, db=db) as txn:
            for key in keys[i : i + 10_000]:
                txn.put(key, value, db=db)
    put = time.perf_counter() - start
    env.sync(True)
    env.close()
    start = time.perf_counter()
    env = lmdb.open(directory, map_size=1 << 36, max_dbs=2, readahead=False)
    db = env.open_db(b"units")
    reopen = time.perf_counter() - start
    start = time.perf_counter()
    for key in sample:
        with env.begin(db=db) as txn:
            assert txn.get(key) is not None
    read = time.perf_counter() - start
    env.close()
    return put, reopen, read


def run_rocksdict(directory: str, keys: list[bytes], value: bytes, sample: list[bytes]) -> tuple[float, float, float]:
    from rocksdict import Options, Rdict, WriteBatch

    options = Options(raw_mode=True)
    db = Rdict(directory, options)
    start = time.perf_counter()
    for i in range(0, len(keys), 10_000):
        batch = WriteBatch(raw_mode=True)
        for key in keys[i : i + 10_000]:
            batch.put(key, value)
        db.write(batch)
    put = time.perf_counter() - start
    db.flush()
    db.close()
    start = time.perf_counter()
    db = Rdict(directory, options)
    reopen = time.perf_counter() - start
    start = time.perf_counter()
    for key in sample:
        assert db.get(key) is not None
    read = time.perf_counter() - start
    db.close()
    return put, reopen, read


ENGINES = {"lmdb": run_lmdb, "rocksdict": run_rocksdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--engines", default="lmdb,rocksdict")
    args = parser.parse_args()
    n = args.keys
    rng = random.Random(45)
    by_name = [b"%LMQ%q" + str(i).encode() + b"\0" + struct.pack(">q", 0) for i in range(n)]
    rng.shuffle(by_name)
    by_number = [struct.pack(">QQ", i, 0) for i in range(n)]
    value = UNIT.pack(123_456, 200, 0, 1_700_000_000_000)
    for engine in args.engines.split(","):
        try:
            __import__(engine)
        except ImportError:
            print(f"{engine}: not installed, skipped")
            continue
        for shape, keys in (("by name", by_name), ("by number", by_number)):
            root = tempfile.mkdtemp(prefix="tidemq-kv-")
            try:
                put, reopen, read = ENGINES[engine](root, keys, value, rng.sample(keys, 10_000))
                files, size = disk(root)
                print(f"{engine:9} {shape:9}: {n / put:>9,.0f} puts/s, reopen {reopen * 1000:6.1f} ms, "
                      f"{10_000 / read:>8,.0f} random reads/s, {files} files, {size / n:.0f} bytes/key")
            finally:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
