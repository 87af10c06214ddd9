"""Lite push consumers of the official Java 5.2.0 and Go v5.1.4 clients (tests/e2e/clients.py;
neither has a lite simple consumer): a consumer subscribed to two lite topics gets exactly their
messages, the backlog and then, after the broker restarted under it, new ones; another lite
topic's messages never reach it.  One server (the subject does not depend on the flush policy)."""

from __future__ import annotations

import pytest

from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, wait_until
from .test_lite import lite_topic_and_group, send_lite
from .test_sdk import clients, unique  # noqa: F401 (fixture)

FLUSH_MODES = ("async",)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """The module's broker, telling push consumers a long polling time of 5 s: a client's
    shutdown waits for its receive in progress."""
    s = ServerProcess(tmp_path_factory.mktemp("lite-clients") / "store", "--flush", request.param,
                      "--long-polling-timeout-ms", "5000").start()
    yield s
    assert s.stop() == 0, s.log_text()


def progress(address: str, topic: str) -> dict[str, tuple[int, int]]:
    """Per lite topic of `topic`: (backlog, in flight) of its one lite group."""
    listing = admin_call(address, "ListLite", bind_topic=topic)
    return {t["lite_topic"]: (t["groups"][0]["backlog"], t["groups"][0]["in_flight"]) for t in listing["lite_topics"]}


@pytest.mark.parametrize("language", ["java", "go"])
def test_official_lite_push_consumers_get_exactly_their_lite_topics_across_a_restart(server, clients, request, language):  # noqa: F811
    client = request.getfixturevalue(f"{language}_client")
    topic, group = lite_topic_and_group(server.address)
    mine, other = unique("mine"), unique("other")
    producer = clients.producer(topic)
    before = send_lite(producer, topic, {f"{mine}-1": 2, f"{mine}-2": 1, other: 2})
    running = client.start("receive", server.address, "--topic", topic, "--group", group, "--push", "--count", 5,
                           "--lite-topics", f"{mine}-1,{mine}-2", "--timeout-ms", 120_000, timeout=180)
    wait_until(lambda: progress(server.address, topic).get(f"{mine}-1") == (0, 0)
               and progress(server.address, topic).get(f"{mine}-2") == (0, 0),
               timeout=90, what="the backlog of its lite topics consumed and acked")
    server.stop()
    server.start(same_port=True)
    after = send_lite(producer, topic, {f"{mine}-1": 1, f"{mine}-2": 1, other: 1})
    finished = running.wait().check()
    received = finished.events("received")
    want = before[f"{mine}-1"] | before[f"{mine}-2"] | after[f"{mine}-1"] | after[f"{mine}-2"]
    assert {m["message_id"] for m in received} == want
    assert {m["lite_topic"] for m in received} == {f"{mine}-1", f"{mine}-2"}
    assert progress(server.address, topic)[other] == (3, 0)  # nobody's
