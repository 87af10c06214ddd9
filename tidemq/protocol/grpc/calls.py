"""A gRPC call as a handler sees it (`Rpc`), how a method is served (`Method`), and the resumption
of a handler coroutine that was run inline up to its first suspension (`Resume`)."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UNARY, SERVER_STREAM, BIDI_STREAM = "unary", "server-stream", "bidi-stream"


@dataclass(frozen=True)
class Method:
    """How to serve one method.  `handler(request, rpc)`:
    - UNARY: returns the response, or a coroutine that does;
    - SERVER_STREAM: a coroutine returning the list of responses (written in order, then the
      status); it may set `rpc.on_unwritten(count)`, told how many were not written if the stream
      breaks;
    - BIDI_STREAM: `handler(rpc)`, a coroutine that reads with `await rpc.read()` (None at the
      end) and writes with `await rpc.write(message)`; the status follows its return."""

    kind: str
    handler: Callable
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]


class Rpc:
    """One call (one HTTP/2 stream), as a handler sees it."""

    __slots__ = (
        "connection",
        "stream_id",
        "method",
        "metadata",
        "deadline",
        "request",
        "task",
        "cancelled",
        "on_unwritten",
        "encoding",
        "received",
        "remote_closed",
        "headers_sent",
        "finished",
        "messages",
        "reader",
        "unacknowledged",
    )

    def __init__(
        self, connection, stream_id: int, method: Method, metadata: tuple, deadline: float, encoding: str
    ) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.method = method
        self.metadata = metadata  # ((key, value), ...)
        self.deadline = deadline  # seconds since the epoch
        self.request: Any = None  # the request's bytes, then its decoded message
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.on_unwritten: Callable[[int], None] | None = None
        self.encoding = encoding  # grpc-encoding of the request messages
        self.received: bytearray | None = bytearray()  # request bytes not yet cut into messages
        self.remote_closed = False  # the client ended its side
        self.headers_sent = False
        self.finished = False  # the status is queued: nothing more is written
        self.messages: collections.deque | None = None  # bidi: request messages not yet read
        self.reader: asyncio.Future | None = None  # bidi: a read waiting for a message
        self.unacknowledged = 0  # bidi: octets received while messages were unread, not yet given back

    def metadata_value(self, key: str) -> str:
        for k, v in self.metadata:
            if k == key:
                return v
        return ""

    def peer(self) -> str:
        """ "ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412"."""
        return self.connection.peer

    def time_remaining(self) -> float:
        return self.deadline - time.time()

    # -- bidi streams --

    def read(self) -> asyncio.Future:
        """The next request message, None once the client has finished or gone."""
        future = self.connection.loop.create_future()
        messages = self.messages
        if messages:
            future.set_result(messages.popleft())
            if not messages and self.unacknowledged:
                self.connection.acknowledge(self, self.unacknowledged)
                self.unacknowledged = 0
        elif self.remote_closed or self.cancelled:
            future.set_result(None)
        else:
            self.reader = future
        return future

    def write(self, message) -> asyncio.Future:
        """Resolves to whether the message was written."""
        future = self.connection.loop.create_future()
        if self.finished or self.cancelled:
            future.set_result(False)
        else:
            self.connection.send_message(self, self.method.encode(message), future)
        return future

    def _deliver(self, message) -> None:
        reader = self.reader
        if reader is not None:
            self.reader = None
            if not reader.done():
                reader.set_result(message)
                return
        if message is not None:
            if self.messages is None:
                self.messages = collections.deque()
            self.messages.append(message)


class Resume:
    """Awaitable: the rest of a coroutine that was run by hand up to its first suspension, on the
    task that takes it over (the future it was waiting for is handed to the task)."""

    __slots__ = ("coroutine", "waiting")

    def __init__(self, coroutine, waiting) -> None:
        self.coroutine, self.waiting = coroutine, waiting

    def __await__(self):
        coroutine, waiting = self.coroutine, self.waiting
        self.coroutine = self.waiting = None
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancellation)
                try:
                    waiting = coroutine.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value
