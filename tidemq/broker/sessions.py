"""Clients the broker has heard from: their type, group, and whether they are still alive.

A client is alive while its telemetry stream is open or it sent a heartbeat within
`client_expire_ms`; NotifyClientTermination ends it.  Owned by the event loop."""

from __future__ import annotations

from dataclasses import dataclass, field

PRODUCER = "PRODUCER"
PUSH_CONSUMER = "PUSH_CONSUMER"
SIMPLE_CONSUMER = "SIMPLE_CONSUMER"


@dataclass(slots=True)
class ClientSession:
    client_id: str
    client_type: str = ""
    group: str = ""
    topics: list[str] = field(default_factory=list)
    last_seen: int = 0
    telemetry_streams: int = 0
    terminated: bool = False


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What the broker tells a client in reply to its Settings."""

    max_body_size: int
    validate_message_type: bool
    send_attempts: int  # producers: total send attempts
    max_delivery_attempts: int  # consumers: retryMaxTimes + 1
    retry_backoff_ms: tuple[int, ...]  # push consumers: invisible time of the n-th nack
    long_polling_timeout_ms: int
    fifo: bool = False
    lite_subscription_quota: int = 1200  # lite consumers: lite topics one client may subscribe
    max_lite_topic_size: int = 64


class Sessions:
    def __init__(self, expire_ms: int) -> None:
        self.expire_ms = expire_ms
        self.clients: dict[str, ClientSession] = {}

    def touch(self, client_id: str, now: int) -> ClientSession:
        session = self.clients.get(client_id)
        if session is None:
            session = self.clients[client_id] = ClientSession(client_id)
        session.last_seen = now
        session.terminated = False
        return session

    def alive(self, client_id: str, now: int) -> bool:
        session = self.clients.get(client_id)
        if session is None or session.terminated:
            return False
        return session.telemetry_streams > 0 or now - session.last_seen < self.expire_ms

    def terminated(self, client_id: str) -> bool:
        session = self.clients.get(client_id)
        return session is not None and session.terminated

    def terminate(self, client_id: str, now: int) -> None:
        session = self.clients.get(client_id)
        if session is None:
            session = self.clients[client_id] = ClientSession(client_id, last_seen=now)
        session.terminated = True

    def expire(self, now: int) -> None:
        dead = [
            cid
            for cid, s in self.clients.items()
            if s.telemetry_streams == 0 and now - s.last_seen >= 2 * self.expire_ms
        ]
        for cid in dead:
            del self.clients[cid]
