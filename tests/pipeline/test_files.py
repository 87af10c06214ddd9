"""Commit logs through the filesystem layer: URIs, and a log on a filesystem that is not local
read in windows exactly as a mapping of the local file reads."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyarrow import fs

from tidemq.pipeline import CorruptLogError, files
from tidemq.pipeline import plan as planning
from tidemq.pipeline.columns import SCHEMA
from tidemq.pipeline.source import ReadSettings, read_range

from pipeline_logs import SEGMENT_SIZE

REMOTE = "remote://"


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """`remote://NAME/...` is tmp_path/NAME/... read through pyarrow's generic file API (not a
    local location, so segments are read in windows), with 4 KiB windows: records straddle
    window ends all the time."""
    tree = fs.SubTreeFileSystem(str(tmp_path), fs.LocalFileSystem())

    def filesystem(location: str):
        assert location.startswith(REMOTE)
        return tree, files._split(location)[0][len(REMOTE) :]

    monkeypatch.setattr(files, "filesystem", filesystem)
    monkeypatch.setattr(files, "WINDOW", 4096)
    return tmp_path


def read_all(logs, partition_size):
    settings = ReadSettings({}, SCHEMA)
    parts = planning.plan(logs, partition_size)
    return parts, pa.Table.from_batches([b for p in parts for b in read_range(p, settings)])


def test_a_remote_log_reads_as_the_local_one(written_store, remote):
    store, messages, _ = written_store
    shutil.copytree(store, remote / "broker-a")
    local_logs = planning.resolve([str(store)])
    remote_logs = planning.resolve([f"{REMOTE}broker-a"])
    assert remote_logs[0].broker == "broker-a" and remote_logs[0].directory == f"{REMOTE}broker-a/commitlog"

    local_parts, local_rows = read_all(local_logs, 16 * 1024)
    remote_parts, remote_rows = read_all(remote_logs, 16 * 1024)
    assert [(p.lo, p.hi) for p in remote_parts] == [(p.lo, p.hi) for p in local_parts]
    assert len(remote_parts) > 2 * len(planning.segments(local_logs[0].directory))
    assert remote_rows.num_rows == len(messages)
    assert remote_rows.equals(local_rows)
    # a remote log defaults to one range per segment: the planner need not walk it
    assert planning.default_partition_size(remote_logs) == planning.NO_END
    whole = planning.plan(remote_logs, planning.default_partition_size(remote_logs))
    assert [(p.lo, p.hi) for p in whole] == [(s, s + size) for s, _, size in planning.segments(local_logs[0].directory)]
    assert planning.log_end(remote_logs[0], 0) == planning.log_end(local_logs[0], 0)


def test_damage_in_a_remote_log_is_found_as_in_a_local_one(written_store, remote):
    store, _, results = written_store
    shutil.copytree(store, remote / "broker-a")
    segments = sorted((remote / "broker-a" / "commitlog").iterdir())
    # a torn tail: the last record of the newest segment cut short
    last = results[-1]
    newest = segments[-1]
    newest.write_bytes(newest.read_bytes()[: last.commit_log_offset % SEGMENT_SIZE + 100].ljust(newest.stat().st_size, b"\0"))
    local_logs = planning.resolve([str(remote / "broker-a")])
    remote_logs = planning.resolve([f"{REMOTE}broker-a"])
    torn = planning.tail_damage(remote_logs[0])
    assert torn is not None and torn.offset == last.commit_log_offset
    assert torn == planning.tail_damage(local_logs[0])
    assert planning.chain_end(remote_logs[0]) == planning.chain_end(local_logs[0])
    # corruption in the middle: the read stops with the offset
    victim = next(r for r in results[200:] if r.size > 300)
    segment = segments[victim.commit_log_offset // SEGMENT_SIZE]
    data = bytearray(segment.read_bytes())
    data[victim.commit_log_offset % SEGMENT_SIZE + 150] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=f"offset {victim.commit_log_offset} .*--end-offset {victim.commit_log_offset}"):
        read_all(remote_logs, 16 * 1024)


def test_locations():
    assert files.normalize("file:///tmp/a%25b/store") == "/tmp/a%b/store"
    assert files.normalize("s3a://bucket/store?region=eu-west-1") == "s3://bucket/store?region=eu-west-1"
    assert files.is_local(files.normalize("relative/store")) and files.normalize("relative/store").startswith("/")
    queue = files.join("s3://bucket/out?region=eu-west-1", "%RETRY%group-a", "0")
    assert queue == "s3://bucket/out/%25RETRY%25group-a/0?region=eu-west-1"
    assert files.basename(files.parent(queue)) == "%RETRY%group-a"
    assert files.uri("/tmp/a b") == "file:///tmp/a%20b"


def test_remote_writes(remote):
    target = f"{REMOTE}out/consumequeue/topic/0"
    files.makedirs(target)
    files.write_file(files.join(target, "00000000000000000000"), b"\1" * 40, 100)
    assert (remote / "out/consumequeue/topic/0/00000000000000000000").read_bytes() == b"\1" * 40 + bytes(60)
    (remote / "built").mkdir()
    (remote / "built" / "a").write_bytes(b"index")
    files.upload_tree(str(remote / "built"), f"{REMOTE}out/index")
    assert (remote / "out/index/a").read_bytes() == b"index"
    files.remove_tree(f"{REMOTE}out/index")
    assert not files.exists(f"{REMOTE}out/index") and files.exists(f"{REMOTE}out/consumequeue")


def test_a_flipped_header_byte_stops_the_read_by_the_whole_record_crc(tmp_path):
    from tidemq.store import Message, MessageStore, StoreConfig

    store = tmp_path / "broker-a"
    with MessageStore(store, StoreConfig(segment_size=1 << 20, dispatch_workers=0)) as writer:
        puts = [writer.put(Message(topic="T", body=b"body %d" % i)) for i in range(5)]
    segment = store / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[puts[2].commit_log_offset + 40] ^= 0x10  # BORNTIMESTAMP: outside the body CRC
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=rf"offset {puts[2].commit_log_offset} \(whole-record CRC"):
        read_all(planning.resolve([str(store)]), 16 * 1024)
