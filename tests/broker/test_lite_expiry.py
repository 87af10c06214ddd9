"""Expiry of a consumed light queue with its consumers' progress, at each crash point: the
process is killed at a step of expiry (a fault object given at construction), reopened, and the
same lite topic is sent to again: its subscriber receives every new message."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.broker import lite
from tidemq.store import Message

from .test_lite import ExpiringHarness, bodies, drain, lite_setup, send, sync

ROOT = Path(__file__).resolve().parents[2]
OLD = [b"old%d" % i for i in range(5)]
NEW = [b"new%d" % i for i in range(3)]


class Kill:
    """Ends the process at one step of light-queue expiry, as a SIGKILL would (no close)."""

    def __init__(self, step: str) -> None:
        self.step = step

    def reached(self, step: str) -> None:
        if step == self.step:
            os._exit(9)


class SendAt:
    """Stores a message of the lite topic at one step of light-queue expiry (straight into the
    store, as a send running beside the maintenance round does)."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.harness: ExpiringHarness | None = None

    def reached(self, step: str) -> None:
        if step == self.step and self.harness is not None:
            store = self.harness.store
            queue = lite.queue_of("B", "t")
            store.put(Message("B", NEW[0], properties={"INNER_MULTI_DISPATCH": queue, "__LITE_TOPIC": "t"}))
            store.wait_dispatched()


def consume_and_expire(h: ExpiringHarness) -> None:
    """Five messages of lite topic t read and acked by client c1 of group G, then t idle past
    the expiry time and the broker's maintenance round run."""
    lite_setup(h)
    sync(h, "c1", "PARTIAL_ADD", ["t"])
    for body in OLD:
        send(h, "t", body)
    got = drain(h, "c1")
    assert bodies(got) == OLD
    for r in got:
        h.broker.ack("G", lite.queue_of("B", "t"), r.receipt_handle)
    h.broker.lite.maintain(h.clock())  # the consumed offset 5 reaches the light-queue tables
    h.clock.advance(61_000)
    h.broker.lite.maintain(h.clock())


def run_killed(directory: Path, step: str) -> None:  # in the child process
    h = ExpiringHarness(directory, expiry_faults=Kill(step))
    consume_and_expire(h)


@pytest.mark.parametrize("step", ["forgotten", "deleted"])
def test_a_kill_during_expiry_loses_no_message_of_the_recreated_queue(tmp_path, step):
    directory = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", f"from tests.broker.test_lite_expiry import run_killed; run_killed({str(directory)!r}, {step!r})"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 9, child.stderr  # killed at the step
    h = ExpiringHarness(directory)
    try:
        sync(h, "c1", "PARTIAL_ADD", ["t"])
        for body in NEW:
            send(h, "t", body)
        got = bodies(drain(h, "c1"))
        if step == "deleted":  # the queue went with its progress: a new queue from offset 0
            assert got == NEW
        else:  # the progress went first, the queue stayed: its messages come again, none is lost
            assert got == sorted(NEW + OLD)
    finally:
        h.close()
        h.loop.close()


def test_a_queue_written_to_between_forgetting_and_deleting_stays_with_its_progress(tmp_path):
    faults = SendAt("forgotten")
    h = ExpiringHarness(tmp_path / "store", expiry_faults=faults)
    try:
        faults.harness = h
        consume_and_expire(h)
        assert h.store.max_offset(lite.queue_of("B", "t"), 0) == len(OLD) + 1  # alive: not deleted
        assert h.broker.lite.topics_of("c1") == ["t"]
        assert bodies(drain(h, "c1")) == [NEW[0]]  # read on from its progress: nothing again
        faults.harness = None
        h.close()
        h.open()  # the progress given back is in the journal
        sync(h, "c1", "PARTIAL_ADD", ["t"])
        assert drain(h, "c1") == []
    finally:
        h.close()
        h.loop.close()
