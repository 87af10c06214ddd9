"""The asyncio adapter of the gRPC server: one `Connection` (an `asyncio.Protocol`) per client moves
bytes between its transport and its sans-I/O `H2Connection`, turns the connection's events into
calls, and keeps the time limits.  It holds what the gRPC layer may hold per connection, each
bounded: incomplete request messages (`max_request_buffer`; the call that exceeds it is refused
with RESOURCE_EXHAUSTED), a bidi stream's unread messages (their octets go back to the client's
window only as the handler reads them), a compressed message's inflated size; and it stops
reading from a client while the transport says the client reads nothing."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Sequence

from ..http2 import (
    DataReceived,
    DataSent,
    H2Connection,
    ProtocolError,
    RequestReceived,
    StreamClosed,
    StreamReset,
    TrailersReceived,
    frames,
    hpack,
)
from .calls import BIDI_STREAM, Rpc
from .framing import (
    FOREVER,
    INTERNAL,
    MESSAGE_PREFIX,
    NOT_METADATA,
    OK,
    OK_TRAILERS,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEADERS,
    UNIMPLEMENTED,
    Refused,
    binary_metadata,
    inflate,
    parse_timeout,
    trailers,
)

log = logging.getLogger(__name__)

_U32 = struct.Struct(">I")
# the answer to a request that is not gRPC: its status, a plain-text body
_NOT_GRPC_BODY = b"this port serves gRPC (content-type application/grpc, method POST)\n"
_WRITTEN = object()  # the token of a queued message whose writing nobody awaits


class Connection(asyncio.Protocol):
    """One client connection: the asyncio adapter around an `H2Connection`, and its calls.  Hand
    it a transport (`connection_made`) that carries HTTP/2 bytes: plaintext, or already TLS."""

    def __init__(self, server) -> None:
        self.server = server
        self.loop = server.loop
        self.limits = server.limits
        self.h2 = H2Connection(server.limits)
        self.transport: asyncio.Transport  # from connection_made, before any other call
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
            elif name not in NOT_METADATA:
                metadata.append((name, binary_metadata(value) if name.endswith("-bin") else value))
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
            deadline = time.time() + parse_timeout(timeout) if timeout else FOREVER
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
        received = rpc.received
        assert received is not None  # held until the client's side of the call closes
        if rpc.method.kind == BIDI_STREAM:
            received += data
            self._read_messages(rpc)
            if rpc.messages and not rpc.cancelled:  # unread: given back once the handler reads them
                rpc.unacknowledged += len(data)
            else:
                self.acknowledge(rpc, len(data))
        elif data:  # taken into the request message (within the limits) or dropped with the call
            self.h2.acknowledge_received_data(stream_id, len(data))
            received += data
            self.buffered += len(data)
            limit = self.server.max_receive_message_length
            if len(received) >= 5 and (_U32.unpack_from(received, 1)[0] > limit or len(received) > limit + 5):
                self._refuse(rpc, RESOURCE_EXHAUSTED, f"request message larger than the server accepts ({limit} bytes)")
                return
            if self.buffered > self.server.max_request_buffer:
                self._refuse(rpc, RESOURCE_EXHAUSTED, "the connection holds too many incomplete requests")
                return
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
        assert received is not None  # held until the client's side of the call closes
        rpc.received = None
        self.buffered -= len(received)
        try:
            if len(received) >= 5 and received[0] == 0 and _U32.unpack_from(received, 1)[0] == len(received) - 5:
                rpc.request = bytes(memoryview(received)[5:])  # the usual: one whole uncompressed message
            else:
                messages, rest = self._cut_messages(rpc, received)
                if rest:
                    raise Refused(INTERNAL, "the request ends inside a message")
                if len(messages) != 1:
                    raise Refused(
                        INTERNAL if messages else UNIMPLEMENTED,
                        "exactly one request message is required" if messages else "no request message",
                    )
                rpc.request = messages[0]
        except Refused as exc:
            self.finish(rpc, exc.code, str(exc))
            return
        self.server.run(rpc)

    def _cut_messages(self, rpc: Rpc, received: bytearray) -> tuple[list[bytes], int]:
        """The whole gRPC messages in `received` (inflated) and the octets of a partial one left."""
        messages = []
        position, size = 0, len(received)
        limit = self.server.max_receive_message_length
        while size - position >= 5:
            compressed, length = MESSAGE_PREFIX.unpack_from(received, position)
            if length > limit:
                raise Refused(
                    RESOURCE_EXHAUSTED, f"request message of {length} bytes is larger than the server accepts"
                )
            if size - position - 5 < length:
                break
            message = bytes(memoryview(received)[position + 5 : position + 5 + length])
            position += 5 + length
            if compressed:
                message = inflate(message, rpc.encoding, self.server.max_inflated_message_length)
            messages.append(message)
        return messages, size - position

    def _read_messages(self, rpc: Rpc) -> None:
        """Deliver the whole messages received on a bidi stream to its handler."""
        received = rpc.received
        assert received is not None  # held until the client's side of the call closes
        try:
            messages, rest = self._cut_messages(rpc, received)
        except Refused as exc:
            self._refuse(rpc, exc.code, str(exc))
            return
        del received[: len(received) - rest]
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
        self.h2.send_trailers(stream_id, RESPONSE_HEADERS + trailers(code, details))
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
            h2.send_headers(rpc.stream_id, RESPONSE_HEADERS)
        sent = h2.send_data(rpc.stream_id, MESSAGE_PREFIX.pack(0, len(data)) + data, token=written or _WRITTEN)
        if sent and written is not None:
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
            closed = h2.respond(
                rpc.stream_id, RESPONSE_HEADERS, MESSAGE_PREFIX.pack(0, len(message)) + message, OK_TRAILERS
            )
        else:
            if message is not None:
                rpc.finished = False
                self.send_message(rpc, message)
                rpc.finished = True
            if rpc.headers_sent:
                block = OK_TRAILERS if code == OK and not details else trailers(code, details)
            else:  # trailers only
                block = RESPONSE_HEADERS + trailers(code, details)
            closed = h2.send_trailers(rpc.stream_id, block)
        if closed:
            self._drop(rpc, cancelled=False)
        self._schedule_flush()

    def _drop(self, rpc: Rpc, cancelled: bool, unsent: Sequence = ()) -> None:
        """Forget `rpc`; if it was cancelled (reset, or the connection lost), its handler is
        cancelled and what it had not written is reported."""
        if self.streams.pop(rpc.stream_id, None) is None:
            return
        if rpc.received is not None and rpc.method.kind != BIDI_STREAM:
            self.buffered -= len(rpc.received)
            rpc.received = None
        if rpc.unacknowledged:  # a bidi stream's unread octets: nobody will read them
            self.h2.acknowledge_received_data(rpc.stream_id, rpc.unacknowledged)
            rpc.unacknowledged = 0
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
            log.warning(
                "dropping the connection from %s: it has read nothing for %.0f s",
                self.peer,
                limits.write_stall_timeout_s,
            )
            self.closed = True
            self.transport.abort()
        elif not self.streams and not self.h2.streams and now - self.last_active > limits.idle_timeout_s:
            self.go_away()
