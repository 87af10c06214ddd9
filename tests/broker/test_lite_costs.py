"""Lite topics at the broker level, the costs a client or a long-lived broker can run up, in
virtual time: arrivals wake only the receives subscribed to their lite topic (one per group),
the subscription log grows by the change and stays in proportion to the table, gone clients
expire at their deadlines, only changed consumed offsets reach the light-queue tables (never
consumerOffset.json), and partial adds are bounded in size, rate and total."""

import asyncio
import json
import os

import pytest

from tidemq.broker import BrokerError, Code, Publish, ReceiveRequest, lite, lite_subscriptions
from tidemq.broker.lite import COMPLETE_ADD, PARTIAL_ADD, PARTIAL_REMOVE

from .conftest import Harness
from .test_journal_faults import FullDisk
from .test_lite import ExpiringHarness, bodies, lite_setup, send, sync


def counting_pops(broker) -> dict[str, int]:
    """Count the lite pops of each client (the work a wake-up costs)."""
    counts: dict[str, int] = {}
    pop = broker.lite.pop

    def counted(req, *args):
        counts[req.client_id] = counts.get(req.client_id, 0) + 1
        return pop(req, *args)

    broker.lite.pop = counted
    return counts


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_an_arrival_wakes_one_waiting_subscriber_of_its_lite_topic_per_group(harness):
    lite_setup(harness)
    lite_setup(harness, group="G2")
    broker = harness.broker
    sync(harness, "a1", PARTIAL_ADD, ["a"])
    sync(harness, "a2", PARTIAL_ADD, ["a"])  # shares lite topic a in group G
    sync(harness, "b1", PARTIAL_ADD, ["b"])
    sync(harness, "x1", PARTIAL_ADD, ["a"], group="G2")
    pops = counting_pops(broker)

    async def scenario():
        waits = {
            (client, group): asyncio.ensure_future(
                broker.receive(ReceiveRequest(group, "B", client_id=client, poll_ms=60_000))
            )
            for client, group in (("a1", "G"), ("a2", "G"), ("b1", "G"), ("x1", "G2"))
        }
        await settle()
        before = dict(pops)
        assert before == {"a1": 1, "a2": 1, "b1": 1, "x1": 1} and not any(w.done() for w in waits.values())
        await broker.send(Publish(topic="B", body=b"to-a", message_id="A1", message_type="LITE", lite_topic="a"))
        await asyncio.get_running_loop().run_in_executor(None, harness.store.wait_dispatched)
        await settle()
        woken = {client for client, count in pops.items() if count > before[client]}
        assert woken in ({"a1", "x1"}, {"a2", "x1"})  # one of G's subscribers, G2's; never b1
        assert bodies(await waits[("x1", "G2")]) == [b"to-a"]
        (taker,) = woken - {"x1"}
        assert bodies(await waits[(taker, "G")]) == [b"to-a"]
        other = waits[("a2" if taker == "a1" else "a1", "G")]
        assert not other.done() and not waits[("b1", "G")].done()
        broker.long_polling.close()
        await asyncio.gather(*waits.values())

    harness.run(scenario())


def log_lines(h) -> list[dict]:
    path = h.store.directory / "config" / lite_subscriptions.LOG_FILE
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_each_subscription_change_appends_its_names_and_a_restart_restores_the_table(tmp_path):
    h = Harness(tmp_path / "store")
    try:
        lite_setup(h)
        sync(h, "c1", COMPLETE_ADD, [f"t{i}" for i in range(100)])
        sync(h, "c2", PARTIAL_ADD, ["u"])
        lines = len(log_lines(h))
        sync(h, "c1", PARTIAL_ADD, ["new"])
        sync(h, "c1", PARTIAL_REMOVE, ["t0"])
        sync(h, "c1", COMPLETE_ADD, h.broker.lite.topics_of("c1"))  # the same set: nothing to write
        h.broker.lite.drop("B", "u")  # c2's last: it goes
        assert log_lines(h)[lines:] == [
            {"c": "c1", "g": "G", "t": "B", "v": -1, "+": ["new"]},
            {"c": "c1", "g": "G", "t": "B", "v": -1, "-": ["t0"]},
            {"c": "c2", "x": 1},
        ]
        expected = sorted({f"t{i}" for i in range(1, 100)} | {"new"})
        h.close()
        h.open()
        assert h.broker.lite.topics_of("c1") == expected and h.broker.lite.topics_of("c2") == []
        assert h.broker.lite.table.by_queue[lite.queue_of("B", "new")] == {"c1"}
    finally:
        h.close()
        h.loop.close()


def test_the_log_is_compacted_in_proportion_to_the_table_and_a_torn_line_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(lite_subscriptions, "_COMPACT_MIN_LINES", 20)
    h = Harness(tmp_path / "store")
    try:
        lite_setup(h)
        for i in range(200):  # churn: two live clients, hundreds of changes
            sync(h, "c1", PARTIAL_ADD, [f"a{i}"])
            sync(h, "c1", PARTIAL_REMOVE, [f"a{i}"])
            sync(h, "c2", COMPLETE_ADD, [f"b{i}"])
        assert len(log_lines(h)) <= 20
        h.close()
        path = h.directory / "config" / lite_subscriptions.LOG_FILE
        with open(path, "ab") as f:
            f.write(b'{"c":"c3","g":"G","t":"B","+":["torn')  # a write cut short by a kill
        h.open()
        assert h.broker.lite.topics_of("c2") == ["b199"] and h.broker.lite.topics_of("c1") == []
        assert h.broker.lite.topics_of("c3") == []
    finally:
        h.close()
        h.loop.close()


def test_the_whole_table_file_of_earlier_versions_is_read_once(tmp_path):
    config = tmp_path / "store" / "config"
    config.mkdir(parents=True)
    document = {"subscriptions": {"c1": {"group": "G", "topic": "B", "liteTopicSet": ["a", "b"], "version": 3}}}
    (config / lite_subscriptions.OLD_FILE).write_text(json.dumps(document))
    h = Harness(tmp_path / "store")
    try:
        assert h.broker.lite.topics_of("c1") == ["a", "b"]
        assert not (config / lite_subscriptions.OLD_FILE).exists()
        h.close()
        h.open()
        assert h.broker.lite.topics_of("c1") == ["a", "b"]
    finally:
        h.close()
        h.loop.close()


def advance(h, ms: int, step: int = 1_000) -> None:
    """Move virtual time on by `ms`, letting the broker's background rounds run as it passes."""
    for _ in range(ms // step):
        h.clock.advance(step)
        h.run(settle())


def test_gone_clients_lose_their_sets_at_their_deadline_on_the_brokers_clock(tmp_path):
    h = Harness(tmp_path / "store", client_expire_ms=60_000)
    try:
        lite_setup(h)
        sync(h, "early", PARTIAL_ADD, ["a"])
        advance(h, 30_000)
        sync(h, "late", PARTIAL_ADD, ["a"])
        sync(h, "kept", PARTIAL_ADD, ["b"])
        advance(h, 35_000)  # 65 s after "early" synced, 35 s after the others
        assert [h.broker.lite.topics_of(c) for c in ("early", "late", "kept")] == [[], ["a"], ["b"]]
        sync(h, "kept", COMPLETE_ADD, ["b"])  # its periodic complete set moves its deadline
        advance(h, 30_000)
        assert [h.broker.lite.topics_of(c) for c in ("late", "kept")] == [[], ["b"]]
        assert h.broker.lite.table.by_queue == {lite.queue_of("B", "b"): {"kept"}}
    finally:
        h.close()
        h.loop.close()


def test_lite_offsets_go_to_the_light_queue_tables_only_and_a_restart_does_not_renew_idle_queues(tmp_path):
    h = ExpiringHarness(tmp_path / "store")
    try:
        lite_setup(h)
        sync(h, "c1", PARTIAL_ADD, ["a"])
        send(h, "a", b"a0")
        h.send("N", b"n0")
        for r in h.receive("G", "B", client_id="c1"):
            h.broker.ack("G", lite.queue_of("B", "a"), r.receipt_handle)
        for r in h.receive("NG", "N"):
            h.broker.ack("NG", "N", r.receipt_handle)
        advance(h, 6_000)  # a maintenance round
        assert h.store.light_queues.consumer_offset("G", lite.queue_of("B", "a")) == 1
        advance(h, 24_000)
        h.close()  # consumerOffset.json holds the plain topic's offsets, not the light queue's
        table = json.loads((h.directory / "config" / "consumerOffset.json").read_text())["offsetTable"]
        assert "N@NG" in table and not [key for key in table if key.startswith("%LMQ%")]
        h.open()
        advance(h, 40_000)  # the restarted broker's rounds find the tables up to date: no write
        assert h.store.light_queues.expire_idle(h.clock()) == [lite.queue_of("B", "a")]  # idle for 60 s
    finally:
        h.close()
        h.loop.close()


def test_partial_adds_are_bounded_in_size_rate_and_total(tmp_path):
    h = Harness(
        tmp_path / "store", lite_subscription_quota=5, max_sync_lite_subscription_rate=10, max_lite_subscription_count=8
    )

    def refused(client, action, names) -> int:
        with pytest.raises(BrokerError) as error:
            sync(h, client, action, names)
        return error.value.code

    try:
        lite_setup(h)
        assert refused("hostile", PARTIAL_ADD, ["x"] * 306) == Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
        for i in range(5):
            sync(h, "hostile", PARTIAL_ADD, [f"h{i}"])
        for _ in range(5):  # the rest of the second's budget, each adding nothing new
            sync(h, "hostile", PARTIAL_ADD, ["h0"])
        assert refused("hostile", PARTIAL_ADD, ["h9"]) == Code.TOO_MANY_REQUESTS == 42900
        assert refused("polite", PARTIAL_ADD, ["p"]) == Code.TOO_MANY_REQUESTS  # the rate is the broker's
        sync(h, "polite", COMPLETE_ADD, ["p0", "p1"])  # complete sets are not rate-limited
        h.clock.advance(100)  # a tenth of a second: one more partial add
        sync(h, "polite", PARTIAL_ADD, ["p2"])
        assert refused("polite", PARTIAL_ADD, ["p3"]) == Code.TOO_MANY_REQUESTS
        h.clock.advance(1_000)
        assert refused("other", PARTIAL_ADD, ["o"]) == Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED  # 8 held
        sync(h, "hostile", COMPLETE_ADD, ["h0"])  # shrinking is always allowed
        sync(h, "other", PARTIAL_ADD, ["o"])
        assert h.broker.lite.table.active == 5
        assert h.broker.lite.topics_of("hostile") == ["h0"]
    finally:
        h.close()
        h.loop.close()


@pytest.mark.parametrize("journal", ["writable", "full"])
def test_an_expired_queues_progress_stays_forgotten_across_a_restart(tmp_path, journal):
    h = ExpiringHarness(tmp_path / "store")
    try:
        lite_setup(h)
        sync(h, "c1", PARTIAL_ADD, ["gone"])
        for i in range(3):
            send(h, "gone", b"g%d" % i)
        for r in h.receive("G", "B", client_id="c1"):
            h.broker.ack("G", lite.queue_of("B", "gone"), r.receipt_handle)
        advance(h, 6_000)
        if journal == "full":  # the journal refuses the forgetting: the queue is not deleted either
            h.broker.journal.write = FullDisk(room=0)
        h.clock.advance(61_000)
        h.store.run_maintenance()
        h.run(settle())
        pair = ("G", lite.queue_of("B", "gone"))
        if journal == "full":  # kept whole, progress and queue: its next messages follow the three
            assert pair in h.broker.subscriptions and h.store.max_offset(pair[1], 0) == 3
        else:
            assert pair not in h.broker.subscriptions
        h.broker.journal.write = os.write
        advance(h, 6_000)
        h.close()
        h.open()  # the queue of that name starts again at 0: none of its messages is skipped
        sync(h, "c1", PARTIAL_ADD, ["gone"])
        send(h, "gone", b"new0")
        send(h, "gone", b"new1")
        assert bodies(h.receive("G", "B", client_id="c1")) == [b"new0", b"new1"]
    finally:
        h.close()
        h.loop.close()
