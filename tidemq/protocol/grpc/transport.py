"""The gRPC server under the broker's services: gRPC's message framing on HTTP/2 (RFC 9113), run on
the broker's event loop.

HTTP/2 itself is `tidemq.protocol.http2`: a sans-I/O connection that owns every stream and both
directions of flow control.  This module is the asyncio adapter around it (`_Connection`: bytes
from the transport into the connection, its events into calls, its bytes back out) and the gRPC
layer: request messages cut from DATA and inflated (gzip or deflate, named by `grpc-encoding`;
answers are not compressed), handlers run, answers and status trailers written.  Why tidemq serves
HTTP/2 itself rather than through grpcio's server: docs/http2.md.

Handlers see a call as an `Rpc`; they run on the event loop.  A handler that returns a coroutine is
first run to its first suspension inline: most answers (a send under async flush, a receive that
finds messages) need no task at all.

What a connection may cost is bounded (`http2.Limits`): besides the connection's own limits, the
octets of incomplete request messages it holds (a call pushing them above `max_request_buffer` is
refused with RESOURCE_EXHAUSTED), a bidi stream's unread messages (their octets are given back to
the client's window only as the handler reads them), a compressed message's inflated size, the
time to send the preface, idle time, time spent not reading what the server writes (reading from
a client stops while it does not read), and the number of connections.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

try:  # zlib-ng inflates about ten times faster: the event loop's turn is shorter
    from zlib_ng import zlib_ng as zlib
except ImportError:  # pragma: no cover - a dependency, but the standard zlib does the same
    import zlib

from ..http2 import (DataReceived, DataSent, H2Connection, Limits, ProtocolError, RequestReceived, StreamClosed,
                     StreamReset, TrailersReceived)
from ..http2 import frames
from ..http2 import hpack

log = logging.getLogger(__name__)

UNARY, SERVER_STREAM, BIDI_STREAM = "unary", "server-stream", "bidi-stream"
CANCELLED_CALLS_WAIT_S = 5.0  # at shutdown, how long cancelled calls get to end
DEFAULT_MAX_RECEIVE_MESSAGE = 16 << 20

# gRPC status codes
OK, CANCELLED, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 1, 2, 8, 12, 13

_PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length
_U32 = struct.Struct(">I")
_FOREVER = float(1 << 40)  # the deadline of a call without grpc-timeout, in seconds since the epoch
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_NOT_METADATA = frozenset(("content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"))
_MAX_DETAILS = 1024  # characters of grpc-message sent

# ":status: 200" is entry 8 of HPACK's static table; "content-type" is entry 31
_RESPONSE_HEADERS = b"\x88" + hpack.encode_indexed_name(31, b"application/grpc")
_OK_TRAILERS = hpack.encode_literal(b"grpc-status", b"0")
# the answer to a request that is not gRPC: its status, a plain-text body
_NOT_GRPC_BODY = b"this port serves gRPC (content-type application/grpc, method POST)\n"
_WRITTEN = object()  # the token of a queued message whose writing nobody awaits


def _trailers(code: int, details: str) -> bytes:
    block = hpack.encode_literal(b"grpc-status", str(code).encode())
    if details:
        block += hpack.encode_literal(b"grpc-message", _percent_encode(details[:_MAX_DETAILS]))
    return block


def _percent_encode(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as is, the rest %XX of its UTF-8."""
    raw = text.encode("utf-8", "replace")
    return b"".join(bytes((c,)) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)


def _binary(value: str) -> bytes:
    """A "-bin" metadata value: base64, padded or not."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return value.encode("latin-1")


def _timeout(value: str) -> float:
    """grpc-timeout ("1S", "2999m") in seconds."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit() or len(value) > 9:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(value[:-1]) * unit


class _Refused(Exception):
    """A request the server will not serve: answered with `code` and the message."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """A compressed request message, inflated to at most `limit` octets (else RESOURCE_EXHAUSTED)."""
    if encoding == "gzip":
        wbits = 31
    elif encoding == "deflate":
        wbits = 15
    else:
        raise _Refused(INTERNAL, "compressed flag set without a grpc-encoding")
    inflater = zlib.decompressobj(wbits)
    try:
        inflated = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise _Refused(INTERNAL, f"compressed request message: {exc}") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise _Refused(RESOURCE_EXHAUSTED, f"a request message larger than the {limit} octets the server accepts "
                                           "once inflated")
    return inflated


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

    __slots__ = ("connection", "stream_id", "method", "metadata", "deadline", "request", "task", "cancelled",
                 "on_unwritten", "encoding", "received", "remote_closed", "headers_sent", "finished", "messages",
                 "reader", "unacknowledged")

    def __init__(self, connection: "_Connection", stream_id: int, method: Method, metadata: tuple,
                 deadline: float, encoding: str) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.method = method
        self.metadata = metadata  # ((key, value), ...)
        self.deadline = deadline  # seconds since the epoch
        self.request = None
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.on_unwritten: Callable[[int], None] | None = None
        self.encoding = encoding  # grpc-encoding of the request messages
        self.received = bytearray()  # request bytes not yet cut into messages
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
        """"ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412"."""
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


class _Resume:
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
            except BaseException as exc:  # noqa: B036 - thrown in by the task (a cancellation)
                try:
                    waiting = coroutine.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value


class GrpcServer:
    """Serves `methods` ({"/package.Service/Method": Method}) on the running event loop."""

    def __init__(self, methods: dict[str, Method], max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE,
                 limits: Limits | None = None, max_inflated_message_length: int | None = None) -> None:
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
        self._connections: set[_Connection] = set()
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

    def protocol(self) -> asyncio.Protocol:
        """A new connection's protocol: give it a transport that carries HTTP/2 (plaintext, or TLS
        already unwrapped) with `connection_made`."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return _Connection(self)

    def _tick(self) -> None:
        """Once a second: the connections' time limits."""
        now = self.loop.time()
        for connection in list(self._connections):
            connection.check_time(now)
        self._clock = self.loop.call_later(1.0, self._tick)

    async def stop(self, grace: float) -> None:
        """Accept no new connection or call; give the calls in flight `grace` seconds, then cancel
        them, wait for their handlers, and close every connection."""
        if self._server is None:
            return
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
        except asyncio.TimeoutError:
            for connection in list(self._connections):
                connection.cancel_all()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CANCELLED_CALLS_WAIT_S)
            if pending:
                log.warning("gRPC calls still open %.0f s after cancelling them; stopping anyway",
                            CANCELLED_CALLS_WAIT_S)
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
        self._spawn(rpc, self._respond_later(rpc, _Resume(response, waiting), respond))

    def _spawn(self, rpc: Rpc, coroutine) -> None:
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


class _Connection(asyncio.Protocol):
    """One client connection: the asyncio adapter around an `H2Connection`, and its calls.  Hand
    it a transport (`connection_made`) that carries HTTP/2 bytes: plaintext, or already TLS."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = server.loop
        self.limits = server.limits
        self.h2 = H2Connection(server.limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.streams: dict[int, Rpc] = {}  # the calls in flight
        self.not_grpc: dict[int, bytes] = {}  # requests that are not gRPC, answered (this status) once read
        self.buffered = 0  # octets of incomplete unary and server-stream requests held
        self.flush_scheduled = False
        self.parsing = False
        self.going_away = False
        self.closed = False
        self.writing_paused_at: float | None = None  # loop time the transport asked us to stop writing
        self.opened_at = self.last_active = server.loop.time()

    # -- asyncio.Protocol --

    def connection_made(self, transport) -> None:
        self.transport = transport
        connections = self.server._connections
        if len(connections) >= self.limits.max_connections:
            log.warning("refusing a connection: %d connections are open", len(connections))
            self.closed = True
            transport.abort()
            return
        connections.add(self)
        name = transport.get_extra_info("peername")  # (the loop's TCP transports set TCP_NODELAY)
        if name:
            self.peer = f"ipv6:[{name[0]}]:{name[1]}" if ":" in name[0] else f"ipv4:{name[0]}:{name[1]}"
        self.h2.initiate()
        if self.server._stopping:
            self.go_away()
        self.flush()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server._connections.discard(self)
        self.cancel_all()

    def pause_writing(self) -> None:
        """The client reads less than we write: read nothing more from it until it catches up."""
        self.writing_paused_at = self.loop.time()
        if not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused_at = None
        if not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        self.parsing = True
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as exc:
            self.parsing = False
            self._fail(exc)
            return
        try:
            for event in events:
                kind = type(event)
                if kind is DataReceived:
                    self._on_data(event)
                elif kind is RequestReceived:
                    self._on_request(event)
                elif kind is TrailersReceived:
                    self._on_end(event.stream_id)
                elif kind is StreamReset:
                    self._on_reset(event)
                elif kind is DataSent:
                    self._on_sent(event)
                elif kind is StreamClosed:
                    rpc = self.streams.get(event.stream_id)
                    if rpc is not None:
                        self._drop(rpc, cancelled=False)
        finally:
            self.parsing = False
        self.flush()

    # -- requests --

    def _on_request(self, event: RequestReceived) -> None:
        stream_id = event.stream_id
        path = method_name = content_type = encoding = ""
        timeout = None
        metadata = []
        for name, value in event.headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
                elif name == ":method":
                    method_name = value
            elif name not in _NOT_METADATA:
                metadata.append((name, _binary(value) if name.endswith("-bin") else value))
            elif name == "content-type":
                content_type = value
            elif name == "grpc-timeout":
                timeout = value
            elif name == "grpc-encoding":
                encoding = value
        ends = event.end_stream
        if method_name != "POST" or not content_type.startswith("application/grpc"):
            self.not_grpc[stream_id] = b"405" if method_name != "POST" else b"415"
            if ends:
                self._answer_not_grpc(stream_id)
            return
        try:
            deadline = time.time() + _timeout(timeout) if timeout else _FOREVER
        except ValueError as exc:
            self._answer_only(stream_id, INTERNAL, str(exc))
            return
        method = self.server.methods.get(path)
        if method is None:
            self._answer_only(stream_id, UNIMPLEMENTED, "Method not found!")
            return
        if encoding not in ("", "identity", "gzip", "deflate"):
            self._answer_only(stream_id, UNIMPLEMENTED, f"message encoding {encoding!r} is not supported")
            return
        rpc = Rpc(self, stream_id, method, tuple(metadata), deadline, encoding)
        self.streams[stream_id] = rpc
        if method.kind == BIDI_STREAM:
            self.server.run(rpc)
        if ends:
            self._on_end(stream_id)

    def _on_data(self, event: DataReceived) -> None:
        stream_id, data = event.stream_id, event.data
        rpc = self.streams.get(stream_id)
        if rpc is None or rpc.remote_closed:  # not gRPC, or a call already answered: dropped
            self.h2.acknowledge_received_data(stream_id, len(data))
            if event.end_stream and stream_id in self.not_grpc:
                self._answer_not_grpc(stream_id)
            return
        if rpc.method.kind == BIDI_STREAM:
            rpc.received += data
            self._read_messages(rpc)
            if rpc.messages:  # unread: given back once the handler reads them
                rpc.unacknowledged += len(data)
            else:
                self.acknowledge(rpc, len(data))
        elif data:
            received = rpc.received
            received += data
            limit = self.server.max_receive_message_length
            if len(received) >= 5 and (_U32.unpack_from(received, 1)[0] > limit or len(received) > limit + 5):
                self._refuse(rpc, RESOURCE_EXHAUSTED, f"request message larger than the server accepts ({limit} bytes)")
                return
            self.buffered += len(data)
            if self.buffered > self.server.max_request_buffer:
                self._refuse(rpc, RESOURCE_EXHAUSTED, "the connection holds too many incomplete requests")
                return
            self.h2.acknowledge_received_data(stream_id, len(data))
        if event.end_stream:
            self._on_end(stream_id)

    def acknowledge(self, rpc: Rpc, size: int) -> None:
        """The handler consumed `size` octets of `rpc`'s request."""
        self.h2.acknowledge_received_data(rpc.stream_id, size)
        self._schedule_flush()

    def _on_end(self, stream_id: int) -> None:
        """The client ended its side of a stream."""
        rpc = self.streams.get(stream_id)
        if rpc is None:
            if stream_id in self.not_grpc:
                self._answer_not_grpc(stream_id)
            return
        if rpc.remote_closed:
            return
        rpc.remote_closed = True
        if rpc.method.kind == BIDI_STREAM:
            self._read_messages(rpc)
            rpc._deliver(None)
            return
        received = rpc.received
        rpc.received = None
        self.buffered -= len(received)
        try:
            if len(received) >= 5 and received[0] == 0 and _U32.unpack_from(received, 1)[0] == len(received) - 5:
                rpc.request = bytes(memoryview(received)[5:])  # the usual: one whole uncompressed message
            else:
                messages, rest = self._cut_messages(rpc, received)
                if rest:
                    raise _Refused(INTERNAL, "the request ends inside a message")
                if len(messages) != 1:
                    raise _Refused(INTERNAL if messages else UNIMPLEMENTED,
                                   "exactly one request message is required" if messages else "no request message")
                rpc.request = messages[0]
        except _Refused as exc:
            self.finish(rpc, exc.code, str(exc))
            return
        self.server.run(rpc)

    def _cut_messages(self, rpc: Rpc, received: bytearray) -> tuple[list[bytes], int]:
        """The whole gRPC messages in `received` (inflated) and the octets of a partial one left."""
        messages = []
        position, size = 0, len(received)
        limit = self.server.max_receive_message_length
        while size - position >= 5:
            compressed, length = _PREFIX.unpack_from(received, position)
            if length > limit:
                raise _Refused(RESOURCE_EXHAUSTED, f"request message of {length} bytes is larger than the server accepts")
            if size - position - 5 < length:
                break
            message = bytes(memoryview(received)[position + 5:position + 5 + length])
            position += 5 + length
            if compressed:
                message = inflate(message, rpc.encoding, self.server.max_inflated_message_length)
            messages.append(message)
        return messages, size - position

    def _read_messages(self, rpc: Rpc) -> None:
        """Deliver the whole messages received on a bidi stream to its handler."""
        received = rpc.received
        try:
            messages, rest = self._cut_messages(rpc, received)
        except _Refused as exc:
            self._refuse(rpc, exc.code, str(exc))
            return
        del received[:len(received) - rest]
        decode = rpc.method.decode
        for data in messages:
            try:
                message = decode(data)
            except Exception:  # not a message of this method: the stream ends
                log.warning("undecodable message on a %s stream", rpc.method.handler.__name__)
                rpc.remote_closed = True
                rpc._deliver(None)
                return
            rpc._deliver(message)

    def _on_reset(self, event: StreamReset) -> None:
        self.not_grpc.pop(event.stream_id, None)
        rpc = self.streams.get(event.stream_id)
        if rpc is not None:
            self._drop(rpc, cancelled=True, unsent=event.unsent)

    def _on_sent(self, event: DataSent) -> None:
        token = event.token
        if token is not _WRITTEN and not token.done():
            token.set_result(True)

    def _refuse(self, rpc: Rpc, code: int, details: str) -> None:
        """Answer a call with `code` before its request is read (the rest of it is reset)."""
        if rpc.received is not None and rpc.method.kind != BIDI_STREAM:
            self.buffered -= len(rpc.received)
        rpc.received = None
        rpc.remote_closed = True
        self.finish(rpc, code, details)
        self._drop(rpc, cancelled=True)

    def _answer_only(self, stream_id: int, code: int, details: str) -> None:
        """Answer a call that is not started with its status alone (a trailers-only response)."""
        self.h2.send_trailers(stream_id, _RESPONSE_HEADERS + _trailers(code, details))
        self._schedule_flush()

    def _answer_not_grpc(self, stream_id: int) -> None:
        status = self.not_grpc.pop(stream_id)
        block = hpack.encode_indexed_name(8, status) + hpack.encode_indexed_name(31, b"text/plain")
        self.h2.send_headers(stream_id, block)
        self.h2.send_data(stream_id, _NOT_GRPC_BODY, end_stream=True)
        self._schedule_flush()

    # -- writing --

    def send_message(self, rpc: Rpc, data: bytes, written: asyncio.Future | None = None) -> None:
        """Queue one response message on `rpc` (its headers first, if not yet sent)."""
        if rpc.finished or rpc.cancelled:
            if written is not None:
                written.set_result(False)
            return
        h2 = self.h2
        if not rpc.headers_sent:
            rpc.headers_sent = True
            h2.send_headers(rpc.stream_id, _RESPONSE_HEADERS)
        if h2.send_data(rpc.stream_id, _PREFIX.pack(0, len(data)) + data, token=written or _WRITTEN):
            if written is not None:
                written.set_result(True)
        self._schedule_flush()

    def finish(self, rpc: Rpc, code: int, details: str = "", message: bytes | None = None) -> None:
        """End a call with its status (after `message`, a unary call's answer, if given)."""
        if rpc.finished or rpc.cancelled:
            return
        rpc.finished = True
        h2 = self.h2
        if message is not None and not rpc.headers_sent and code == OK:  # the usual unary answer
            rpc.headers_sent = True
            closed = h2.respond(rpc.stream_id, _RESPONSE_HEADERS, _PREFIX.pack(0, len(message)) + message, _OK_TRAILERS)
        else:
            if message is not None:
                rpc.finished = False
                self.send_message(rpc, message)
                rpc.finished = True
            if rpc.headers_sent:
                block = _OK_TRAILERS if code == OK and not details else _trailers(code, details)
            else:  # trailers only
                block = _RESPONSE_HEADERS + _trailers(code, details)
            closed = h2.send_trailers(rpc.stream_id, block)
        if closed:
            self._drop(rpc, cancelled=False)
        self._schedule_flush()

    def _drop(self, rpc: Rpc, cancelled: bool, unsent: list = ()) -> None:
        """Forget `rpc`; if it was cancelled (reset, or the connection lost), its handler is
        cancelled and what it had not written is reported."""
        if self.streams.pop(rpc.stream_id, None) is None:
            return
        if rpc.received is not None and rpc.method.kind != BIDI_STREAM:
            self.buffered -= len(rpc.received)
            rpc.received = None
        if cancelled and not rpc.cancelled:
            rpc.cancelled = True
            if rpc.stream_id in self.h2.streams:
                unsent = self.h2.reset_stream(rpc.stream_id, frames.CANCEL)
            for token in unsent:
                if token is not _WRITTEN and not token.done():
                    token.set_result(False)
            if unsent and rpc.on_unwritten is not None:
                try:
                    rpc.on_unwritten(len(unsent))
                except Exception:
                    log.exception("releasing unwritten responses failed")
            if rpc.reader is not None and not rpc.reader.done():
                rpc.reader.set_result(None)
            if rpc.task is not None and not rpc.task.done():
                rpc.task.cancel()
        if self.server._idle is not None:
            self.server._check_idle()
            if self.going_away and not self.streams:
                self.close()

    def _schedule_flush(self) -> None:
        if not self.parsing and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        data = self.h2.data_to_send()
        if self.closed:
            return
        if data:
            self.transport.write(data)
        if self.writing_paused_at is None and not self.transport.get_write_buffer_size():
            self.h2.output_drained()
        if self.h2.terminated is not None:
            self._fail(self.h2.terminated)

    # -- ending --

    def go_away(self) -> None:
        """Tell the client that no stream above the last one seen will be served."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        self.h2.close()
        self.flush()
        if not self.streams:
            self.close()

    def cancel_all(self) -> None:
        """Cancel every call: its handler, and its stream (RST_STREAM CANCEL)."""
        for rpc in list(self.streams.values()):
            self._drop(rpc, cancelled=True)
        self.flush()

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True
            self.transport.close()

    def _fail(self, error: ProtocolError) -> None:
        """The client broke the protocol: write the GOAWAY queued, close, cancel every call."""
        if self.closed:
            return
        log.info("closing the gRPC connection from %s: %s", self.peer, error)
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)
        self.closed = True
        self.transport.close()
        self.server._connections.discard(self)
        self.cancel_all()

    def check_time(self, now: float) -> None:
        """The adapter's time limits (called about once a second)."""
        limits = self.limits
        if not self.h2.preface_received and now - self.opened_at > limits.preface_timeout_s:
            log.info("closing a connection from %s: no HTTP/2 preface in %.0f s", self.peer, limits.preface_timeout_s)
            self.close()
        elif self.writing_paused_at is not None and now - self.writing_paused_at > limits.write_stall_timeout_s:
            log.warning("dropping the connection from %s: it has read nothing for %.0f s", self.peer,
                        limits.write_stall_timeout_s)
            self.closed = True
            self.transport.abort()
        elif not self.streams and not self.h2.streams and now - self.last_active > limits.idle_timeout_s:
            self.go_away()
