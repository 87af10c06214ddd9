"""Priority messages with the official Java 5.2.0 and Go v5.1.4 clients (tests/e2e/clients.py):
sent with `--type PRIORITY --priority P` and received by a Simple consumer highest level first;
a Push consumer gets every message of a backlog the Python SDK sent (one client process a run:
the Go client's message view does not expose the priority, so each body names it)."""

from __future__ import annotations

import pytest

from .test_priority import create_priority_topic, priority_message, send_all
from .test_sdk import clients, unique  # noqa: F401 (fixture)

LEVELS_SENT = (2, 9, 0)


def level_of(received: dict) -> int:
    return int(received["body"].split("-")[0][1:])


def send_levels(client, server, topic: str, count: int = 3) -> list[str]:
    ids = []
    for p in LEVELS_SENT:
        sent = client.run("send", server.address, "--topic", topic, "--type", "PRIORITY", "--priority", p,
                          "--count", count, "--body", f"p{p}-{{i}}").check()
        ids.extend(m["message_id"] for m in sent.events("sent"))
    return ids


@pytest.mark.parametrize("language", ["java", "go"])
def test_official_clients_send_priority_messages_and_receive_them_highest_first(server, request, language):
    client = request.getfixturevalue(f"{language}_client")
    topic = create_priority_topic(server.address)
    ids = send_levels(client, server, topic)
    received = client.run("receive", server.address, "--topic", topic, "--group", unique("G"), "--count", len(ids),
                          "--simple", "--await-ms", 2000, "--timeout-ms", 60_000).check().events("received")
    assert sorted(m["message_id"] for m in received) == sorted(ids)
    levels = [level_of(m) for m in received]
    assert levels == sorted((p for p in LEVELS_SENT for _ in range(3)), reverse=True)
    if language == "java":  # the Java client reads the priority of every delivered message
        assert [m["priority"] for m in received] == levels


@pytest.mark.parametrize("language", ["java", "go"])
def test_official_push_consumers_receive_every_priority_message_with_its_level(server, clients, request, language):  # noqa: F811
    client = request.getfixturevalue(f"{language}_client")
    topic = create_priority_topic(server.address)
    producer = clients.producer(topic)
    ids = send_all(producer, [priority_message(topic, p, b"p%d-%d" % (p, i)) for p in LEVELS_SENT for i in range(3)])
    received = client.run("receive", server.address, "--topic", topic, "--group", unique("G"), "--count", len(ids),
                          "--push", "--timeout-ms", 60_000).check().events("received")
    assert sorted(m["message_id"] for m in received) == sorted(ids)
    if language == "java":
        assert all(m["priority"] == level_of(m) for m in received)
