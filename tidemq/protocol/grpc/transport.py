"""The gRPC server under the broker's services, run on the broker's event loop: gRPC on HTTP/2
(RFC 9113).  Why tidemq serves HTTP/2 itself rather than through grpcio's server: docs/http2.md.

- `tidemq.protocol.http2`: HTTP/2, sans I/O: frames, HPACK, a connection that owns every stream and
  both directions of flow control, and the limits it enforces;
- `adapter.py`: the asyncio protocol around one connection (bytes in and out, events to calls,
  time limits, back-pressure);
- `framing.py`: gRPC's message framing, status trailers, metadata, compressed messages;
- `calls.py`: a call as a handler sees it (`Rpc`) and how a method is served (`Method`);
- here: `GrpcServer`, which listens, runs the handlers and stops.

Handlers see a call as an `Rpc`; they run on the event loop.  A handler that returns a coroutine is
first run to its first suspension inline: most answers (a send under async flush, a receive that
finds messages) need no task at all.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from ..http2 import Limits
from ..http2.frames import PREFACE
from .adapter import Connection
from .calls import BIDI_STREAM, SERVER_STREAM, UNARY, Method, Resume, Rpc
from .framing import CANCELLED, INTERNAL, OK, UNKNOWN

__all__ = [
    "BIDI_STREAM",
    "DEFAULT_MAX_RECEIVE_MESSAGE",
    "PREFACE",
    "SERVER_STREAM",
    "UNARY",
    "GrpcServer",
    "Method",
    "Rpc",
]

log = logging.getLogger(__name__)

CANCELLED_CALLS_WAIT_S = 5.0  # at shutdown, how long cancelled calls get to end
DEFAULT_MAX_RECEIVE_MESSAGE = 16 << 20


class GrpcServer:
    """Serves `methods` ({"/package.Service/Method": Method}) on the running event loop."""

    def __init__(
        self,
        methods: dict[str, Method],
        max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE,
        limits: Limits | None = None,
        max_inflated_message_length: int | None = None,
    ) -> None:
        """`max_receive_message_length`: the largest request message, as sent; a compressed one
        inflates to at most `max_inflated_message_length` (default: the same)."""
        self.methods = dict(methods)
        self.limits = limits or Limits()
        self.max_receive_message_length = max_receive_message_length
        self.max_inflated_message_length = max_inflated_message_length or max_receive_message_length
        # a connection may always hold one whole request message
        self.max_request_buffer = max(self.limits.max_request_buffer, max_receive_message_length + 5)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[Connection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._idle: asyncio.Future | None = None  # set once stopping and no call is left
        self._clock: asyncio.TimerHandle | None = None

    async def start(self, address: str, listener=None) -> int:
        """Listen on "HOST:PORT" (port 0: any); returns the port.  `listener(protocol_factory, host,
        port)`, when given, accepts the connections in place of the loop's `create_server` and
        returns what stands for the server (`sockets`, `close()`), as `tls.SniffingListener` does."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        self.loop = asyncio.get_running_loop()
        listen = listener or functools.partial(self.loop.create_server, reuse_address=True)
        self._server = await listen(self.protocol, host, int(port))
        self._tick()
        return self._server.sockets[0].getsockname()[1]

    def connection_count(self) -> int:
        """Connections served (handed a transport, not yet closed)."""
        return len(self._connections)

    def protocol(self) -> asyncio.Protocol:
        """A new connection's protocol: give it a transport that carries HTTP/2 (plaintext, or TLS
        already unwrapped) with `connection_made`."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return Connection(self)

    def _tick(self) -> None:
        """Once a second: the connections' time limits."""
        loop = self.loop
        assert loop is not None  # set by start()
        now = loop.time()
        for connection in list(self._connections):
            connection.check_time(now)
        self._clock = loop.call_later(1.0, self._tick)

    async def stop(self, grace: float) -> None:
        """Accept no new connection or call; give the calls in flight `grace` seconds, then cancel
        them, wait for their handlers, and close every connection."""
        if self._server is None:
            return
        assert self.loop is not None  # set by start(), with _server
        self._stopping = True
        self._server.close()
        if self._clock is not None:
            self._clock.cancel()
        self._idle = self.loop.create_future()
        for connection in list(self._connections):
            connection.go_away()
        self._check_idle()
        try:
            await asyncio.wait_for(asyncio.shield(self._idle), grace)
        except TimeoutError:
            for connection in list(self._connections):
                connection.cancel_all()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CANCELLED_CALLS_WAIT_S)
            if pending:
                log.warning(
                    "gRPC calls still open %.0f s after cancelling them; stopping anyway", CANCELLED_CALLS_WAIT_S
                )
        for connection in list(self._connections):
            connection.close()
        self._server = None

    def _check_idle(self) -> None:
        if self._idle is not None and not self._idle.done() and not any(c.streams for c in self._connections):
            self._idle.set_result(None)

    # -- running calls --

    def run(self, rpc: Rpc) -> None:
        """The request has arrived (bidi: the call has started): call the handler, and answer
        at once if it need not wait."""
        try:
            self._run(rpc)
        except Exception:
            log.exception("%s failed", rpc.method.handler.__name__)
            rpc.connection.finish(rpc, UNKNOWN, "internal error")

    def _run(self, rpc: Rpc) -> None:
        method = rpc.method
        if method.kind == BIDI_STREAM:
            self._spawn(rpc, self._respond_later(rpc, method.handler(rpc), self._finish_ok))
            return
        try:
            request = rpc.request = method.decode(rpc.request)
        except Exception:
            rpc.connection.finish(rpc, INTERNAL, "the request message cannot be decoded")
            return
        respond = self._respond if method.kind == UNARY else self._write_stream
        response = method.handler(request, rpc)
        if not asyncio.iscoroutine(response):
            respond(rpc, response)
            return
        try:  # up to its first suspension, here
            waiting = response.send(None)
        except StopIteration as stop:
            respond(rpc, stop.value)
            return
        self._spawn(rpc, self._respond_later(rpc, Resume(response, waiting), respond))

    def _spawn(self, rpc: Rpc, coroutine) -> None:
        assert self.loop is not None  # set by protocol(), before any call
        task = rpc.task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _respond(self, rpc: Rpc, response) -> None:
        rpc.connection.finish(rpc, OK, message=rpc.method.encode(response))

    def _write_stream(self, rpc: Rpc, responses: list) -> None:
        if rpc.cancelled:
            if rpc.on_unwritten is not None:
                rpc.on_unwritten(len(responses))
            return
        encode = rpc.method.encode
        connection = rpc.connection
        for response in responses:
            connection.send_message(rpc, encode(response))
        connection.finish(rpc, OK)

    def _finish_ok(self, rpc: Rpc, _result) -> None:
        rpc.connection.finish(rpc, OK)

    async def _respond_later(self, rpc: Rpc, awaitable, respond) -> None:
        try:
            respond(rpc, await awaitable)
        except asyncio.CancelledError:
            rpc.connection.finish(rpc, CANCELLED, "cancelled")
            raise
        except Exception:
            log.exception("%s failed", rpc.method.handler.__name__)
            rpc.connection.finish(rpc, UNKNOWN, "internal error")
