"""The gRPC server under the broker's services: HTTP/2 (RFC 9113) and gRPC's message framing on it,
written on asyncio and run on the broker's event loop.

Why not grpcio's server: its core runs a poller thread that hands each completion to Python, and
every call crosses between that thread and the event loop.  Driven as lean as it goes (one thread
waiting on the completion queue, one batch per unary answer) it still measured 90-110 us of server
CPU per empty unary call on a 2-core machine, and about 200 us per one-message SendMessage; the
broker's own work per message is 25-30 us of that.  Here a call is parsed, answered and written in
the event loop's own callbacks: no thread, no lock, one write for several answers.

What a gRPC client needs of HTTP/2 is a small part of it: the connection preface and SETTINGS,
HEADERS (HPACK, `hpack.py`) with CONTINUATION, DATA, both directions of flow control, PING, RST_STREAM
and GOAWAY.  Server push and priorities are not used.  Request messages may be compressed (gzip or
deflate, named by `grpc-encoding`); answers are not.

Handlers see a call as an `Rpc`; they run on the event loop.  A handler that returns a coroutine is
first run to its first suspension inline: most answers (a send under async flush, a receive that
finds messages) need no task at all.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import logging
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from . import hpack

log = logging.getLogger(__name__)

UNARY, SERVER_STREAM, BIDI_STREAM = "unary", "server-stream", "bidi-stream"
CANCELLED_CALLS_WAIT_S = 5.0  # at shutdown, how long cancelled calls get to end
DEFAULT_MAX_RECEIVE_MESSAGE = 64 << 20

# gRPC status codes
OK, CANCELLED, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 1, 2, 8, 12, 13

# HTTP/2 frame types, flags, settings and error codes (RFC 9113 §6, §7)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 2, 4, 5, 6
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x7, 0x8, 0x9

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
RECEIVE_WINDOW = 1 << 24  # what the server grants each stream, and the connection
RECEIVE_FRAME_SIZE = 1 << 20  # the largest frame the server accepts
WINDOW_REFILL = RECEIVE_WINDOW // 4  # consumed bytes that earn the peer a WINDOW_UPDATE
HEADER_TABLE_SIZE = 4096
MAX_HEADER_LIST_SIZE = 1 << 16

_FRAME = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")
_FOREVER = float(1 << 40)  # the deadline of a call without grpc-timeout, in seconds since the epoch
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_NOT_METADATA = frozenset(("content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"))


def _frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


_SERVER_PREFACE = (
    _frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in (
        (SETTINGS_ENABLE_PUSH, 0),
        (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
        (SETTINGS_MAX_FRAME_SIZE, RECEIVE_FRAME_SIZE),
        (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST_SIZE),
    )))
    + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW))
)
_SETTINGS_ACK = _frame(SETTINGS, ACK, 0)
# ":status: 200" is entry 8 of HPACK's static table; "content-type" is entry 31
_RESPONSE_HEADERS = b"\x88" + hpack.encode_indexed_name(31, b"application/grpc")
_RESPONSE_HEADERS_FRAME = _FRAME.pack(len(_RESPONSE_HEADERS) << 8 | HEADERS, END_HEADERS, 0)
_OK_TRAILERS = hpack.encode_literal(b"grpc-status", b"0")
_OK_TRAILERS_FRAME = _FRAME.pack(len(_OK_TRAILERS) << 8 | HEADERS, END_STREAM | END_HEADERS, 0)


def _with_stream(frame_header: bytes, stream_id: int) -> bytes:
    """A frame header made for stream 0, for `stream_id`."""
    return frame_header[:5] + _U32.pack(stream_id)


def _trailers(code: int, details: str) -> bytes:
    block = hpack.encode_literal(b"grpc-status", str(code).encode())
    if details:
        block += hpack.encode_literal(b"grpc-message", _percent_encode(details))
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
                 "on_unwritten", "encoding", "received", "remote_closed", "send_window", "receive_unacked",
                 "outbound", "trailers", "headers_sent", "finished", "messages", "reader")

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
        self.send_window = connection.initial_send_window
        self.receive_unacked = 0
        self.outbound: collections.deque | None = None  # [message, written future] waiting for window
        self.trailers: bytes | None = None  # the status frame, written after `outbound`
        self.headers_sent = False
        self.finished = False  # the status is queued: nothing more is written
        self.messages: collections.deque | None = None  # bidi: request messages not yet read
        self.reader: asyncio.Future | None = None  # bidi: a read waiting for a message

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

    def __init__(self, methods: dict[str, Method], max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE) -> None:
        self.methods = dict(methods)
        self.max_receive_message_length = max_receive_message_length
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._idle: asyncio.Future | None = None  # set once stopping and no call is left

    async def start(self, address: str, listener=None) -> int:
        """Listen on "HOST:PORT" (port 0: any); returns the port.  `listener(protocol_factory, host,
        port)`, when given, accepts the connections in place of the loop's `create_server` and
        returns what stands for the server (`sockets`, `close()`), as `tls.SniffingListener` does."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        self.loop = asyncio.get_running_loop()
        listen = listener or functools.partial(self.loop.create_server, reuse_address=True)
        self._server = await listen(lambda: _Connection(self), host, int(port))
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float) -> None:
        """Accept no new connection or call; give the calls in flight `grace` seconds, then cancel
        them, wait for their handlers, and close every connection."""
        if self._server is None:
            return
        self._stopping = True
        self._server.close()
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


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Connection(asyncio.Protocol):
    """One client connection: frames in, calls started, frames out."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.decoder = hpack.Decoder(HEADER_TABLE_SIZE, MAX_HEADER_LIST_SIZE)
        self.streams: dict[int, Rpc] = {}
        self.last_stream_id = 0
        self.initial_send_window = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.max_send_frame = DEFAULT_FRAME_SIZE
        self.receive_unacked = 0
        self.blocked: dict[int, Rpc] = {}  # streams with frames waiting for window, in order
        self.pending: list[bytes] = []  # bytes received that do not make a whole frame yet
        self.pending_size = 0
        self.needed = len(PREFACE)  # bytes the parser needs before it can go on
        self.preface_seen = False
        self.continuing: tuple[int, int, list] | None = None  # a header block awaiting CONTINUATION
        self.out: list[bytes] = []  # frames to write at the end of this turn of the loop
        self.flush_scheduled = False
        self.parsing = False
        self.going_away = False
        self.closed = False

    # -- asyncio.Protocol --

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server._connections.add(self)
        name = transport.get_extra_info("peername")  # (the loop's TCP transports set TCP_NODELAY)
        if name:
            self.peer = f"ipv6:[{name[0]}]:{name[1]}" if ":" in name[0] else f"ipv4:{name[0]}:{name[1]}"
        transport.write(_SERVER_PREFACE)
        if self.server._stopping:
            self.go_away()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server._connections.discard(self)
        self.cancel_all()

    def data_received(self, data: bytes) -> None:
        if self.pending:
            self.pending.append(data)
            self.pending_size += len(data)
            if self.pending_size < self.needed:
                return
            data = b"".join(self.pending)
            self.pending.clear()
        self.parsing = True
        try:
            rest = self._parse(data)
        except _ConnectionError as exc:
            self._fail(exc.code, str(exc))
            return
        except hpack.HpackError as exc:
            self._fail(COMPRESSION_ERROR, f"header block: {exc}")
            return
        finally:
            self.parsing = False
        if rest:
            self.pending.append(rest)
            self.pending_size = len(rest)
        self.flush()

    # -- reading frames --

    def _parse(self, data: bytes) -> bytes:
        """Handle every whole frame in `data`; returns the bytes of an incomplete one."""
        size = len(data)
        position = 0
        if not self.preface_seen:
            if size < len(PREFACE):
                self.needed = len(PREFACE)
                return data
            if data[:len(PREFACE)] != PREFACE:
                raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.preface_seen = True
            position = len(PREFACE)
        handlers = self._handlers
        while True:
            if size - position < 9:
                self.needed = 9
                return data[position:]
            length_type, flags, stream_id = _FRAME.unpack_from(data, position)
            length = length_type >> 8
            end = position + 9 + length
            if end > size:
                if length > RECEIVE_FRAME_SIZE:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                self.needed = 9 + length
                return data[position:]
            ftype = length_type & 0xFF
            payload = data[position + 9:end]
            position = end
            if self.continuing is not None and ftype != CONTINUATION:
                raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
            if ftype < 10:
                handlers[ftype](self, flags, stream_id & 0x7FFFFFFF, payload)
            if self.closed:
                return b""

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self.receive_unacked += len(payload)
        if self.receive_unacked >= WINDOW_REFILL:
            self.out.append(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.receive_unacked)))
            self.receive_unacked = 0
        rpc = self.streams.get(stream_id)
        if rpc is None or rpc.remote_closed:
            if stream_id > self.last_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream already answered or reset: its data is dropped
        rpc.receive_unacked += len(payload)
        data = self._unpad(flags, payload)
        if data:
            rpc.received += data
        if flags & END_STREAM:
            rpc.remote_closed = True
            self._request_done(rpc)
            return
        if rpc.receive_unacked >= WINDOW_REFILL:
            self.out.append(_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(rpc.receive_unacked)))
            rpc.receive_unacked = 0
        if rpc.method.kind == BIDI_STREAM:
            self._read_messages(rpc)
        elif len(rpc.received) >= 5:  # one request message: refused as soon as it is known too large
            limit = self.server.max_receive_message_length
            if _U32.unpack_from(rpc.received, 1)[0] > limit or len(rpc.received) > limit + 5:
                self._refuse(rpc, RESOURCE_EXHAUSTED, f"request message larger than the server accepts ({limit} bytes)")

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, block)
        else:
            self.continuing = (stream_id, flags, [block])

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without a header block")
        fragments = self.continuing[2]
        fragments.append(payload)
        if sum(map(len, fragments)) > MAX_HEADER_LIST_SIZE:
            raise _ConnectionError(PROTOCOL_ERROR, "header block too large")
        if flags & END_HEADERS:
            _, first_flags, _ = self.continuing
            self.continuing = None
            self._header_block(stream_id, first_flags, b"".join(fragments))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the decoder's table follows every block
        rpc = self.streams.get(stream_id)
        if rpc is not None or stream_id <= self.last_stream_id:  # trailers of a request
            if not flags & END_STREAM:
                raise _ConnectionError(PROTOCOL_ERROR, f"second header block on stream {stream_id} does not end it")
            if rpc is not None and not rpc.remote_closed:
                rpc.remote_closed = True
                self._request_done(rpc)
            return
        if stream_id % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"a client stream with an even id {stream_id}")
        self.last_stream_id = stream_id
        if self.going_away:
            self._reset(stream_id, REFUSED_STREAM)
            return
        path = method_name = content_type = encoding = ""
        timeout = None
        metadata = []
        for name, value in headers:
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
        ends = bool(flags & END_STREAM)
        if method_name != "POST" or not content_type.startswith("application/grpc"):
            status = b"405" if method_name != "POST" else b"415"
            block = hpack.encode_indexed_name(8, status)  # ":status"
            self.out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))
            if not ends:
                self._reset(stream_id, NO_ERROR)
            return
        try:
            deadline = time.time() + _timeout(timeout) if timeout else _FOREVER
        except ValueError as exc:
            self._answer_only(stream_id, INTERNAL, str(exc), ends)
            return
        method = self.server.methods.get(path)
        if method is None:
            self._answer_only(stream_id, UNIMPLEMENTED, "Method not found!", ends)
            return
        if encoding not in ("", "identity", "gzip", "deflate"):
            self._answer_only(stream_id, UNIMPLEMENTED, f"message encoding {encoding!r} is not supported", ends)
            return
        rpc = Rpc(self, stream_id, method, tuple(metadata), deadline, encoding)
        self.streams[stream_id] = rpc
        if method.kind == BIDI_STREAM:
            self.server.run(rpc)
        if ends:
            rpc.remote_closed = True
            self._request_done(rpc)

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4 or stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR if stream_id == 0 else FRAME_SIZE_ERROR, "malformed RST_STREAM")
        rpc = self.streams.get(stream_id)
        if rpc is not None:
            self._drop(rpc, cancelled=True)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, f"initial window {value}")
                delta = value - self.initial_send_window
                self.initial_send_window = value
                for rpc in self.streams.values():
                    rpc.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"max frame size {value}")
                self.max_send_frame = value
        self.out.append(_SETTINGS_ACK)
        self._unblock()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PING of a length other than 8")
        if not flags & ACK:
            self.out.append(_frame(PING, ACK, 0, payload))

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        pass  # the client opens no new stream; those in flight go on

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            self._unblock()
            return
        rpc = self.streams.get(stream_id)
        if rpc is None:
            return
        rpc.send_window += increment
        if increment == 0 or rpc.send_window > MAX_WINDOW:
            self._reset(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
            self._drop(rpc, cancelled=True)
        elif rpc.outbound:
            self._send_outbound(rpc)

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _ignore(self, flags: int, stream_id: int, payload: bytes) -> None:
        pass

    _handlers = (_on_data, _on_headers, _ignore, _on_rst_stream, _on_settings, _on_push_promise, _on_ping,
                 _on_goaway, _on_window_update, _on_continuation)

    # -- requests --

    def _cut_messages(self, rpc: Rpc) -> list[bytes] | None:
        """The whole gRPC messages received on `rpc` (decompressed), leaving a partial one; None
        after refusing the call."""
        received = rpc.received
        messages = []
        position, size = 0, len(received)
        while size - position >= 5:
            compressed, length = _PREFIX.unpack_from(received, position)
            if length > self.server.max_receive_message_length:
                self._refuse(rpc, RESOURCE_EXHAUSTED, f"request message of {length} bytes is larger than the server accepts")
                return None
            if size - position - 5 < length:
                break
            message = bytes(memoryview(received)[position + 5:position + 5 + length])
            position += 5 + length
            if compressed:
                try:
                    message = self._decompress(rpc, message)
                except (zlib.error, ValueError) as exc:
                    self._refuse(rpc, INTERNAL, f"compressed request message: {exc}")
                    return None
            messages.append(message)
        if position:
            del received[:position]
        return messages

    def _decompress(self, rpc: Rpc, message: bytes) -> bytes:
        if rpc.encoding == "gzip":
            wbits = 31
        elif rpc.encoding == "deflate":
            wbits = 15
        else:
            raise ValueError("compressed flag set without a grpc-encoding")
        inflater = zlib.decompressobj(wbits)
        data = inflater.decompress(message, self.server.max_receive_message_length + 1)
        if len(data) > self.server.max_receive_message_length or inflater.unconsumed_tail:
            raise ValueError("larger than the server accepts once inflated")
        return data

    def _read_messages(self, rpc: Rpc) -> None:
        messages = self._cut_messages(rpc)
        if messages is None:
            return
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

    def _request_done(self, rpc: Rpc) -> None:
        """The client ended its side of `rpc`."""
        if rpc.method.kind == BIDI_STREAM:
            self._read_messages(rpc)
            rpc._deliver(None)
            return
        received = rpc.received
        if (len(received) >= 5 and received[0] == 0 and _U32.unpack_from(received, 1)[0] == len(received) - 5
                and len(received) - 5 <= self.server.max_receive_message_length):
            messages = [bytes(memoryview(received)[5:])]  # the usual: one whole uncompressed message, copied once
        else:
            messages = self._cut_messages(rpc)
            if messages is None:
                return
            if received:
                self._refuse(rpc, INTERNAL, "the request ends inside a message")
                return
        rpc.received = None
        if len(messages) != 1:
            self.finish(rpc, INTERNAL if messages else UNIMPLEMENTED,
                        "exactly one request message is required" if messages else "no request message")
            return
        rpc.request = messages[0]
        self.server.run(rpc)

    def _refuse(self, rpc: Rpc, code: int, details: str) -> None:
        self.finish(rpc, code, details)
        if not rpc.remote_closed:
            rpc.remote_closed = True
            self._reset(rpc.stream_id, NO_ERROR)
        self._drop(rpc, cancelled=True)

    def _answer_only(self, stream_id: int, code: int, details: str, request_ended: bool) -> None:
        """Answer a call that is not started with its status alone (a trailers-only response)."""
        block = _RESPONSE_HEADERS + _trailers(code, details)
        self.out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))
        if not request_ended:
            self._reset(stream_id, NO_ERROR)
        self._schedule_flush()

    # -- writing --

    def send_message(self, rpc: Rpc, data: bytes, written: asyncio.Future | None = None) -> None:
        """Queue one response message on `rpc` (its headers first, if not yet sent)."""
        if rpc.finished or rpc.cancelled:
            if written is not None:
                written.set_result(False)
            return
        if not rpc.headers_sent:
            rpc.headers_sent = True
            self.out += (_with_stream(_RESPONSE_HEADERS_FRAME, rpc.stream_id), _RESPONSE_HEADERS)
        if rpc.outbound is None:
            rpc.outbound = collections.deque()
        rpc.outbound.append((_PREFIX.pack(0, len(data)) + data, written))
        self._send_outbound(rpc)
        self._schedule_flush()

    def finish(self, rpc: Rpc, code: int, details: str = "", message: bytes | None = None) -> None:
        """End a call with its status (after `message`, a unary call's answer, if given)."""
        if rpc.finished or rpc.cancelled:
            return
        if message is not None:
            size = len(message) + 5
            if (not rpc.headers_sent and code == OK and size <= self.send_window and size <= rpc.send_window
                    and size <= self.max_send_frame):  # the usual unary answer: three frames at once
                self.send_window -= size
                stream_id = rpc.stream_id
                self.out += (_with_stream(_RESPONSE_HEADERS_FRAME, stream_id), _RESPONSE_HEADERS,
                             _FRAME.pack(size << 8 | DATA, 0, stream_id), _PREFIX.pack(0, size - 5), message,
                             _with_stream(_OK_TRAILERS_FRAME, stream_id), _OK_TRAILERS)
                rpc.finished = True
                self._closed_locally(rpc)
                self._schedule_flush()
                return
            self.send_message(rpc, message)
        rpc.finished = True
        if rpc.headers_sent:
            block = _OK_TRAILERS if code == OK and not details else _trailers(code, details)
        else:  # trailers only
            block = _RESPONSE_HEADERS + _trailers(code, details)
        trailers = _frame(HEADERS, END_HEADERS | END_STREAM, rpc.stream_id, block)
        if rpc.outbound:
            rpc.trailers = trailers
        else:
            self.out.append(trailers)
            self._closed_locally(rpc)
        self._schedule_flush()

    def _closed_locally(self, rpc: Rpc) -> None:
        """`rpc`'s status is written: the stream is over for the server."""
        if not rpc.remote_closed:
            self._reset(rpc.stream_id, NO_ERROR)  # the client need not send the rest
            rpc.remote_closed = True  # reset: nothing more comes, and nobody resets it again
        self._drop(rpc, cancelled=False)

    def _send_outbound(self, rpc: Rpc) -> None:
        """Write what flow control lets through of `rpc`'s queued frames."""
        outbound = rpc.outbound
        stream_id = rpc.stream_id
        while outbound:
            data, written = outbound[0]
            allowed = min(self.send_window, rpc.send_window, self.max_send_frame)
            if allowed <= 0:
                self.blocked[stream_id] = rpc
                return
            chunk = data[:allowed]
            self.send_window -= len(chunk)
            rpc.send_window -= len(chunk)
            self.out.append(_FRAME.pack(len(chunk) << 8 | DATA, 0, stream_id))
            self.out.append(chunk)
            if len(chunk) == len(data):
                outbound.popleft()
                if written is not None and not written.done():
                    written.set_result(True)
            else:
                outbound[0] = (data[allowed:], written)
        self.blocked.pop(stream_id, None)
        if rpc.trailers is not None:
            self.out.append(rpc.trailers)
            rpc.trailers = None
            self._closed_locally(rpc)

    def _unblock(self) -> None:
        for rpc in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self._send_outbound(rpc)

    def _reset(self, stream_id: int, code: int) -> None:
        self.out.append(_frame(RST_STREAM, 0, stream_id, _U32.pack(code)))
        self._schedule_flush()

    def _drop(self, rpc: Rpc, cancelled: bool) -> None:
        """Forget `rpc`; if it was cancelled (reset, or the connection lost), its handler is
        cancelled and what it had not written is reported."""
        if self.streams.pop(rpc.stream_id, None) is None:
            return
        self.blocked.pop(rpc.stream_id, None)
        if cancelled and not rpc.cancelled:
            rpc.cancelled = True
            unwritten = len(rpc.outbound or ())
            for _, written in rpc.outbound or ():
                if written is not None and not written.done():
                    written.set_result(False)
            rpc.outbound = None
            if unwritten and rpc.on_unwritten is not None:
                try:
                    rpc.on_unwritten(unwritten)
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
        if not self.parsing and not self.flush_scheduled and self.out:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and not self.closed:
            out = self.out
            self.out = []
            self.transport.write(b"".join(out))
        else:
            self.out.clear()

    # -- ending --

    def go_away(self) -> None:
        """Tell the client that no stream above the last one seen will be served."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        self.out.append(_frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, NO_ERROR)))
        self.flush()
        if not self.streams:
            self.close()

    def cancel_all(self) -> None:
        """Cancel every call: its handler, and its stream (RST_STREAM CANCEL)."""
        for rpc in list(self.streams.values()):
            if not self.closed:
                self._reset(rpc.stream_id, CANCEL)
            self._drop(rpc, cancelled=True)
        self.flush()

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True
            self.transport.close()

    def _fail(self, code: int, reason: str) -> None:
        log.warning("closing gRPC connection from %s: %s", self.peer, reason)
        self.out.append(_frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code) + reason.encode()[:256]))
        self.close()
        self.server._connections.discard(self)
        self.cancel_all()
