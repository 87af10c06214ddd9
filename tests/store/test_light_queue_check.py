"""`tidemq store check` over light queues, in the key-value tables and in RocketMQ's file queues:
every unit points at a record that lists that light queue at that offset, every listed offset
has its unit, each fault reported once; `store repair` rebuilds what is wrong."""

import struct

import pytest

from tidemq.cli import main as cli_main
from tidemq.store import Message, MessageStore, StoreConfig
from tidemq.store.recovery.check import check

BACKENDS = ["kv", "file"]
NAMES = ["%LMQ%a", "%LMQ%b", "%LMQ%c"]


def config(backend):
    return StoreConfig(light_queue_store=backend, dispatch_workers=0, segment_size=1 << 20)


def write(directory, backend):
    """Twelve messages: each to %LMQ%a, every other to %LMQ%b, every third to %LMQ%c too
    (twice in one name list: one unit)."""
    with MessageStore(directory, config(backend)) as store:
        for i in range(12):
            names = ["%LMQ%a"] + ["%LMQ%b"] * (i % 2 == 0) + ["%LMQ%c", "%LMQ%c"] * (i % 3 == 0)
            store.put(Message(topic="parent", body=b"m%d" % i, tags="t", properties={"INNER_MULTI_DISPATCH": ",".join(names)}))
        assert store.wait_dispatched()
        return {name: store.read_units(name, 0, 0, 100) for name in NAMES}


def edit_unit(directory, backend, name, slot, unit=None):
    """Delete (unit None) or overwrite the unit at `slot` of light queue `name`, behind the store."""
    if backend == "file":
        path = directory / "consumequeue" / name / "0" / f"{0:020d}"
        data = bytearray(path.read_bytes())
        data[slot * 20 : slot * 20 + 20] = struct.pack(">qiq", *unit) if unit else b"\0" * 20
        path.write_bytes(bytes(data))
        return
    from tidemq.store.light.kv import NUMBER, UNIT_KEY, UNIT_ROW, KvLightQueues

    kv = KvLightQueues(directory / "lightqueue")
    try:
        with kv.env.begin(write=True) as txn:
            number = NUMBER.unpack(txn.get(name.encode(), db=kv.names))[0]
            key = UNIT_KEY.pack(number, slot)
            if unit is None:
                assert txn.delete(key, db=kv.units)
            else:
                assert txn.put(key, UNIT_ROW.pack(*unit, UNIT_ROW.unpack(txn.get(key, db=kv.units))[3]), db=kv.units)
    finally:
        kv.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_passes_a_sound_store_and_counts_its_light_queue_units(tmp_path, backend):
    units = write(tmp_path, backend)
    assert [len(units[name]) for name in NAMES] == [12, 6, 4]
    report = check(tmp_path)
    assert report.problems == []
    assert report.units == 12 + 12 + 6 + 4  # the parent queue's and the light queues'


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_reports_a_deleted_and_a_damaged_light_queue_unit_once_each(tmp_path, backend, capsys):
    units = write(tmp_path, backend)
    edit_unit(tmp_path, backend, "%LMQ%b", 2)  # deleted
    wrong = units["%LMQ%a"][5]  # %LMQ%c's slot 1 pointed at a record that lists %LMQ%c elsewhere
    edit_unit(tmp_path, backend, "%LMQ%c", 1, (wrong.commit_log_offset, wrong.size, wrong.tags_code))

    problems = check(tmp_path).problems

    assert len(problems) == 2, problems
    (missing,) = [p for p in problems if "%LMQ%b" in p]
    assert missing.startswith("light queue %LMQ%b: 1 unit(s) missing at offset 2 ")
    (damaged,) = [p for p in problems if "%LMQ%c" in p]
    assert damaged.startswith("light queue %LMQ%c offset 1: unit") and f"the record at {wrong.commit_log_offset}" in damaged
    assert cli_main(["store", "check", str(tmp_path)]) == 1
    assert "NOT sound (2 problem(s))" in capsys.readouterr().out

    assert cli_main(["store", "repair", str(tmp_path)]) == 0
    assert check(tmp_path).problems == []
    with MessageStore(tmp_path, config(backend)) as store:
        assert {name: store.read_units(name, 0, 0, 100) for name in NAMES} == units


def test_check_reports_a_light_queue_the_log_lists_and_no_form_holds(tmp_path):
    import shutil

    write(tmp_path, "file")
    shutil.rmtree(tmp_path / "consumequeue" / "%LMQ%c")
    (problem,) = check(tmp_path).problems
    assert problem.startswith("light queue %LMQ%c: 4 unit(s) missing at offsets 0..3 ")
