"""The server side of one HTTP/2 connection (RFC 9113), sans I/O: bytes in, events out
(`receive_data`); calls in, bytes out (`send_*`, then `data_to_send`).  No socket, no clock, no
asyncio: the adapter (`grpc/adapter.py`) moves the bytes and keeps the time.

The connection owns every stream's state and both directions of flow control:
- a stream is open from the client's HEADERS until both sides have ended it or either reset it;
  the application hears of it (`RequestReceived`) only once its request headers are valid
  (RFC 9113 §8.2-8.3); a malformed request is reset (PROTOCOL_ERROR) without reaching it;
- request octets count against the windows the server granted until the application says it has
  consumed them (`acknowledge_received_data`): the client can have no more in flight than the
  windows, however slowly the application reads;
- response DATA waits in the stream for the client's windows; `DataSent` says when a queued
  piece has gone, `StreamClosed` when a stream whose END_STREAM waited for window has ended.

A frame that breaks the protocol for the whole connection raises `ProtocolError` from
`receive_data` after a GOAWAY with its error code is queued: the adapter writes what is queued and
closes.  One that breaks a stream resets that stream (RST_STREAM with the code) and the
connection goes on.  Every quantity a client controls is bounded by `Limits`.
"""

from __future__ import annotations

import collections

from . import frames as f
from . import hpack
from .events import DataReceived, DataSent, RequestReceived, StreamClosed, StreamReset, TrailersReceived
from .headers import StreamError, check_request_headers, check_trailers
from .limits import Limits

__all__ = [
    "DataReceived",
    "DataSent",
    "H2Connection",
    "ProtocolError",
    "RequestReceived",
    "StreamClosed",
    "StreamReset",
    "TrailersReceived",
]

_CLOSED_IDS_KEPT = 4096  # closed streams remembered for precise errors on late frames


class ProtocolError(Exception):
    """The client broke the protocol for the whole connection; `code` is the HTTP/2 error code
    sent in the GOAWAY."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Stream:
    __slots__ = (
        "stream_id",
        "remote_closed",
        "local_closed",
        "send_window",
        "receive_window",
        "receive_unacked",
        "outbound",
        "trailers",
        "content_length",
        "data_length",
    )

    def __init__(self, stream_id: int, send_window: int, receive_window: int) -> None:
        self.stream_id = stream_id
        self.remote_closed = False  # the client sent END_STREAM
        self.local_closed = False  # the server's END_STREAM is queued or sent
        self.send_window = send_window
        self.receive_window = receive_window  # octets the client may still send
        self.receive_unacked = 0  # consumed octets not yet given back in a WINDOW_UPDATE
        self.outbound: collections.deque | None = None  # [data, end_stream, token] waiting for window
        self.trailers: bytes | None = None  # a header block sent with END_STREAM after `outbound`
        self.content_length: int | None = None
        self.data_length = 0


class H2Connection:
    """The server side of one connection.  Call `initiate()` first, then feed what the client
    sends to `receive_data` and write out `data_to_send()` after every call."""

    def __init__(self, limits: Limits | None = None) -> None:
        limits = self.limits = limits or Limits()
        self.decoder = hpack.Decoder(limits.header_table_size, limits.max_header_list_size)
        self._frames = f.FrameBuffer(limits.max_frame_size)
        self._preface = b""  # the part of the client's connection preface received so far
        self._magic_received = False
        self.preface_received = False  # the connection preface and the first SETTINGS have arrived
        self.out: list[bytes] = []
        self.streams: dict[int, _Stream] = {}
        self.last_stream_id = 0  # the highest stream id the client has opened
        self._closed_ids: dict[int, bool] = {}  # recently closed stream -> whether the server reset it
        self._known_names: set[str] = set()
        # sending
        self.initial_send_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.send_window = f.DEFAULT_WINDOW
        self.max_send_frame = f.DEFAULT_FRAME_SIZE
        self._blocked: dict[int, _Stream] = {}  # streams with DATA waiting for window, in order
        self.queued_output = 0  # octets of DATA waiting for window
        self._control_queued = 0  # answers to control frames queued since the client last read everything
        # receiving
        self.receive_window = limits.connection_window
        self._receive_unacked = 0
        self._stream_refill = max(1, limits.stream_window // 4)
        self._connection_refill = max(1, limits.connection_window // 4)
        self._continuing: list | None = None  # [stream id, flags, block, frames, self-dependent]
        # abuse accounting
        self.streams_opened = 0  # streams the client opened, refused ones included
        self.early_resets = 0  # ... of them reset (by it, or refused) before the server answered
        self.going_away = False  # GOAWAY sent: no new stream is served
        self.terminated: ProtocolError | None = None

    # -- the application's side --

    def initiate(self) -> None:
        """Queue the server's connection preface: its SETTINGS and the connection window."""
        limits = self.limits
        self.out.append(
            f.settings_frame(
                {
                    f.SETTINGS_MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                    f.SETTINGS_ENABLE_PUSH: 0,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: limits.stream_window,
                    f.SETTINGS_MAX_FRAME_SIZE: limits.max_frame_size,
                    f.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
                }
            )
        )
        if limits.connection_window > f.DEFAULT_WINDOW:
            self.out.append(f.window_update(0, limits.connection_window - f.DEFAULT_WINDOW))

    def data_to_send(self) -> bytes:
        out = self.out
        if not out:
            return b""
        self.out = []
        return b"".join(out)

    def output_drained(self) -> None:
        """The client has read everything written so far."""
        self._control_queued = 0

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """Response headers (a stream already ended, e.g. reset by the client, takes nothing)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return
        self._header_frames(stream_id, block, end_stream)
        if end_stream:
            self._closed_locally(stream)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False, token=None) -> bool:
        """Queue `data` on the stream; returns whether all of it is sent now (else `DataSent(token)`
        follows once it is).  Beyond `limits.max_queued_output` octets waiting for window, the
        connection ends with ENHANCE_YOUR_CALM."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return False
        if stream.outbound is None:
            stream.outbound = collections.deque()
        stream.outbound.append([data, end_stream, token])
        self.queued_output += len(data)
        if end_stream:
            stream.local_closed = True
        sent = self._send_outbound(stream, None)
        if self.queued_output > self.limits.max_queued_output and not self.terminated:
            self._terminate(f.ENHANCE_YOUR_CALM, "responses waiting for a flow-control window the client keeps closed")
        return sent

    def send_trailers(self, stream_id: int, block: bytes) -> bool:
        """End the stream with a header block after its queued DATA; returns whether it is ended
        now (else `StreamClosed` follows)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return False
        stream.local_closed = True
        if stream.outbound:
            stream.trailers = block
            return False
        self._header_frames(stream_id, block, True)
        self._closed_locally(stream)
        return True

    def respond(self, stream_id: int, headers: bytes, data: bytes, trailers: bytes) -> bool:
        """A whole response: headers, one DATA frame's worth, trailers; returns `send_trailers`'."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return False
        size = len(data)
        if (
            size <= self.send_window
            and size <= stream.send_window
            and size <= self.max_send_frame
            and len(headers) <= self.max_send_frame
            and len(trailers) <= self.max_send_frame
            and not stream.outbound
        ):
            self.send_window -= size
            stream.send_window -= size
            self.out += (
                f.frame_header(f.HEADERS, f.END_HEADERS, stream_id, len(headers)),
                headers,
                f.frame_header(f.DATA, 0, stream_id, size),
                data,
                f.frame_header(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, len(trailers)),
                trailers,
            )
            stream.local_closed = True
            self._closed_locally(stream)
            return True
        self._header_frames(stream_id, headers, False)
        self.send_data(stream_id, data)
        return self.send_trailers(stream_id, trailers)

    def reset_stream(self, stream_id: int, code: int) -> list:
        """Reset an open stream; returns the tokens of its DATA never sent."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return []
        self.out.append(f.rst_stream(stream_id, code))
        return self._forget(stream, reset_by_server=True)

    def acknowledge_received_data(self, stream_id: int, size: int) -> None:
        """The application consumed `size` octets of the stream's request: the client may send as
        many more (a WINDOW_UPDATE once a quarter of a window is due)."""
        unacked = self._receive_unacked + size
        if unacked >= self._connection_refill:
            self.out.append(f.window_update(0, unacked))
            self.receive_window += unacked
            unacked = 0
        self._receive_unacked = unacked
        stream = self.streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            unacked = stream.receive_unacked + size
            if unacked >= self._stream_refill:
                self.out.append(f.window_update(stream_id, unacked))
                stream.receive_window += unacked
                unacked = 0
            stream.receive_unacked = unacked

    def close(self, code: int = f.NO_ERROR, reason: str = "") -> None:
        """GOAWAY: streams the client opens from now on are refused; those open go on."""
        if not self.going_away:
            self.going_away = True
            self.out.append(f.goaway(self.last_stream_id, code, reason.encode()[:256]))

    # -- the client's side --

    def receive_data(self, data: bytes) -> list:
        """Events for the bytes the client sent.  Raises ProtocolError (a GOAWAY queued) when they
        break the connection; after that it raises it again."""
        if self.terminated is not None:
            raise self.terminated
        events: list = []
        try:
            if not self._magic_received:
                after_preface = self._receive_preface(data)
                if after_preface is None:
                    return events
                data = after_preface
            handlers = self._handlers
            for ftype, flags, stream_id, payload in self._frames.feed(data):
                if self._continuing is not None and ftype != f.CONTINUATION:
                    raise ProtocolError(f.PROTOCOL_ERROR, "a header block interrupted by another frame")
                if not self.preface_received:
                    if ftype != f.SETTINGS or flags & f.ACK:
                        raise ProtocolError(f.PROTOCOL_ERROR, "the connection preface is not followed by SETTINGS")
                    self.preface_received = True
                if ftype < 10:
                    handlers[ftype](self, flags, stream_id, payload, events)
        except f.FrameSizeError as exc:
            raise self._terminate(f.FRAME_SIZE_ERROR, str(exc)) from None
        except hpack.HpackError as exc:
            raise self._terminate(f.COMPRESSION_ERROR, f"header block: {exc}") from None
        except ProtocolError as exc:
            raise self._terminate(exc.code, str(exc)) from None
        return events

    def _receive_preface(self, data: bytes) -> bytes | None:
        """The bytes after the client's connection preface, or None while it is incomplete."""
        need = len(f.PREFACE) - len(self._preface)
        self._preface += data[:need]
        if not f.PREFACE.startswith(self._preface):
            raise ProtocolError(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(self._preface) < len(f.PREFACE):
            return None
        self._magic_received = True  # the first SETTINGS must follow
        return data[need:]

    def _terminate(self, code: int, message: str) -> ProtocolError:
        error = self.terminated = ProtocolError(code, message)
        self.going_away = True
        self.out.append(f.goaway(self.last_stream_id, code, message.encode()[:256]))
        return error

    # -- frames --

    def _on_data(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        if length > self.receive_window:
            raise ProtocolError(f.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self.receive_window -= length
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            self.acknowledge_received_data(0, length)  # nobody consumes them
            if stream is not None:
                self._stream_error(stream_id, f.STREAM_CLOSED, events)
            else:
                self._on_closed_stream(stream_id, "DATA")
            return
        if length > stream.receive_window:
            self.acknowledge_received_data(0, length)
            self._stream_error(stream_id, f.FLOW_CONTROL_ERROR, events)
            return
        stream.receive_window -= length
        data = _unpad(flags, payload)
        if len(data) != length:  # padding: consumed here
            self.acknowledge_received_data(stream_id, length - len(data))
        stream.data_length += len(data)
        end = flags & f.END_STREAM
        if stream.content_length is not None and (
            stream.data_length > stream.content_length or (end and stream.data_length != stream.content_length)
        ):
            self._stream_error(stream_id, f.PROTOCOL_ERROR, events)
            return
        if end:
            stream.remote_closed = True
            events.append(DataReceived(stream_id, data, True))
            if stream.local_closed and not stream.outbound and stream.trailers is None:
                self._forget(stream, reset_by_server=False)
        else:
            events.append(DataReceived(stream_id, data, False))

    def _on_headers(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = _unpad(flags, payload)
        self_dependent = False
        if flags & f.PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            self_dependent = f.U32.unpack_from(block)[0] & 0x7FFFFFFF == stream_id
            block = block[5:]
        if len(block) > self.limits.max_header_list_size:
            raise ProtocolError(f.ENHANCE_YOUR_CALM, "a header block larger than SETTINGS_MAX_HEADER_LIST_SIZE")
        if flags & f.END_HEADERS:
            self._header_block(stream_id, flags, block, self_dependent, events)
        else:
            self._continuing = [stream_id, flags, bytearray(block), 0, self_dependent]

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        continuing = self._continuing
        if continuing is None:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "CONTINUATION without a header block")
            raise ProtocolError(
                f.PROTOCOL_ERROR if stream_id in self.streams or stream_id not in self._closed_ids else f.STREAM_CLOSED,
                "CONTINUATION without a header block",
            )
        if continuing[0] != stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, "CONTINUATION of another stream's header block")
        block = continuing[2]
        block += payload
        continuing[3] += 1
        if continuing[3] > self.limits.max_continuation_frames:
            raise ProtocolError(f.ENHANCE_YOUR_CALM, f"a header block in more than {continuing[3]} CONTINUATION frames")
        if len(block) > self.limits.max_header_list_size:
            raise ProtocolError(f.ENHANCE_YOUR_CALM, "a header block larger than SETTINGS_MAX_HEADER_LIST_SIZE")
        if flags & f.END_HEADERS:
            self._continuing = None
            self._header_block(stream_id, continuing[1], bytes(block), continuing[4], events)

    def _header_block(self, stream_id: int, flags: int, block: bytes, self_dependent: bool, events: list) -> None:
        headers = self.decoder.decode(block)  # always: the decoder's table follows every block
        end = bool(flags & f.END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers
            if stream.remote_closed:
                self._stream_error(stream_id, f.STREAM_CLOSED, events)
                return
            try:
                if self_dependent:
                    raise StreamError(f.PROTOCOL_ERROR, "a stream depending on itself")
                if not end:
                    raise StreamError(f.PROTOCOL_ERROR, "a second header block that does not end the stream")
                check_trailers(headers, self._known_names)
                if stream.content_length is not None and stream.data_length != stream.content_length:
                    raise StreamError(f.PROTOCOL_ERROR, "content-length differs from the DATA received")
            except StreamError as exc:
                self._stream_error(stream_id, exc.code, events)
                return
            stream.remote_closed = True
            events.append(TrailersReceived(stream_id))
            if stream.local_closed and not stream.outbound and stream.trailers is None:
                self._forget(stream, reset_by_server=False)
            return
        if stream_id <= self.last_stream_id:
            self._on_closed_stream(stream_id, "HEADERS")
            return
        if stream_id % 2 == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, f"a client stream with the even id {stream_id}")
        self.last_stream_id = stream_id
        self.streams_opened += 1
        if self.going_away:
            self._refuse(stream_id, f.REFUSED_STREAM)
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            self._refuse(stream_id, f.REFUSED_STREAM)
            self._count_early_reset()
            return
        try:
            if self_dependent:
                raise StreamError(f.PROTOCOL_ERROR, "a stream depending on itself")
            content_length = check_request_headers(headers, self._known_names)
        except StreamError as exc:
            self._refuse(stream_id, exc.code)
            return
        stream = self.streams[stream_id] = _Stream(stream_id, self.initial_send_window, self.limits.stream_window)
        stream.content_length = content_length
        if end:
            if content_length:
                self._refuse(stream_id, f.PROTOCOL_ERROR)
                del self.streams[stream_id]
                return
            stream.remote_closed = True
        events.append(RequestReceived(stream_id, headers, end))

    def _on_priority(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, f.FRAME_SIZE_ERROR, events)
        elif f.U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            self._stream_error(stream_id, f.PROTOCOL_ERROR, events)
        # priorities are advice the server does not take

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "RST_STREAM of a length other than 4")
        if stream_id > self.last_stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not stream.local_closed:
            self._count_early_reset()
        unsent = self._forget(stream, reset_by_server=False)
        events.append(StreamReset(stream_id, f.U32.unpack(payload)[0], True, unsent))

    def _on_settings(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id != 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = f.SETTING.unpack_from(payload, offset)
            if key == f.SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise ProtocolError(f.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ProtocolError(f.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
                delta = value - self.initial_send_window
                self.initial_send_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > f.MAX_WINDOW:
                        raise ProtocolError(f.FLOW_CONTROL_ERROR, "a stream's window above 2^31-1")
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_FRAME_SIZE <= value <= f.LARGEST_FRAME_SIZE:
                    raise ProtocolError(f.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.max_send_frame = value
            # the header table size and the rest concern what the server does not use
        self._queue_control(f.SETTINGS_ACK)
        self._unblock(events)

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        raise ProtocolError(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _on_ping(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id != 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "PING of a length other than 8")
        if not flags & f.ACK:
            self._queue_control(f.frame(f.PING, f.ACK, 0, payload))

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id != 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 octets")
        # the client opens no new stream; those in flight go on

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if len(payload) != 4:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = f.U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ProtocolError(f.FLOW_CONTROL_ERROR, "the connection's window above 2^31-1")
            self._unblock(events)
            return
        if stream_id > self.last_stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a closed stream: allowed for a while
        if increment == 0:
            self._stream_error(stream_id, f.PROTOCOL_ERROR, events)
            return
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            self._stream_error(stream_id, f.FLOW_CONTROL_ERROR, events)
        elif stream.outbound or stream.trailers is not None:
            self._send_outbound(stream, events)

    def _ignore(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        pass

    _handlers = (
        _on_data,
        _on_headers,
        _on_priority,
        _on_rst_stream,
        _on_settings,
        _on_push_promise,
        _on_ping,
        _on_goaway,
        _on_window_update,
        _on_continuation,
    )

    # -- streams --

    def _on_closed_stream(self, stream_id: int, what: str) -> None:
        """A frame that needs an open stream, on one that is not."""
        if stream_id > self.last_stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        reset_by_server = self._closed_ids.get(stream_id)
        if reset_by_server:
            return  # the client may not have heard of the reset yet: ignored (RFC 9113 §5.4.2)
        if reset_by_server is None and what == "HEADERS":
            raise ProtocolError(
                f.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}, not above {self.last_stream_id}"
            )
        raise ProtocolError(f.STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    def _stream_error(self, stream_id: int, code: int, events: list) -> None:
        self._queue_control(f.rst_stream(stream_id, code))
        stream = self.streams.get(stream_id)
        if stream is not None:
            events.append(StreamReset(stream_id, code, False, self._forget(stream, reset_by_server=True)))
        else:
            self._remember_closed(stream_id, True)

    def _refuse(self, stream_id: int, code: int) -> None:
        """Reset a stream the application never heard of."""
        self._queue_control(f.rst_stream(stream_id, code))
        self._remember_closed(stream_id, True)

    def _count_early_reset(self) -> None:
        self.early_resets += 1
        if self.early_resets >= self.limits.early_reset_streams and self.early_resets * 2 > self.streams_opened:
            raise ProtocolError(
                f.ENHANCE_YOUR_CALM, f"{self.early_resets} of {self.streams_opened} streams reset before their answer"
            )

    def _queue_control(self, data: bytes) -> None:
        self.out.append(data)
        self._control_queued += 1
        if self._control_queued > self.limits.max_queued_control_frames:
            raise ProtocolError(
                f.ENHANCE_YOUR_CALM, f"{self._control_queued} control frames answered that the client has not read"
            )

    def _header_frames(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        size = self.max_send_frame
        end = f.END_STREAM if end_stream else 0
        if len(block) <= size:
            self.out += (f.frame_header(f.HEADERS, f.END_HEADERS | end, stream_id, len(block)), block)
            return
        pieces = [block[i : i + size] for i in range(0, len(block), size)]
        self.out.append(f.frame(f.HEADERS, end, stream_id, pieces[0]))
        for i, piece in enumerate(pieces[1:], 2):
            self.out.append(f.frame(f.CONTINUATION, f.END_HEADERS if i == len(pieces) else 0, stream_id, piece))

    def _send_outbound(self, stream: _Stream, events: list | None) -> bool:
        """Send what the windows let through of the stream's queued DATA (and then its trailers);
        returns whether nothing is left queued."""
        outbound = stream.outbound
        stream_id = stream.stream_id
        out = self.out
        while outbound:
            item = outbound[0]
            data, end, token = item
            allowed = min(self.send_window, stream.send_window, self.max_send_frame)
            size = len(data)
            if allowed <= 0 and size:
                self._blocked[stream_id] = stream
                return False
            last = size <= allowed
            chunk = data if last else data[:allowed]
            self.send_window -= len(chunk)
            stream.send_window -= len(chunk)
            self.queued_output -= len(chunk)
            out += (f.frame_header(f.DATA, f.END_STREAM if last and end else 0, stream_id, len(chunk)), chunk)
            if last:
                outbound.popleft()
                if token is not None and events is not None:
                    events.append(DataSent(stream_id, token))
                if end:
                    self._closed_locally(stream)
                    if events is not None:
                        events.append(StreamClosed(stream_id))
                    return True
            else:
                item[0] = data[allowed:]
        self._blocked.pop(stream_id, None)
        if stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._header_frames(stream_id, block, True)
            self._closed_locally(stream)
            if events is not None:
                events.append(StreamClosed(stream_id))
        return True

    def _unblock(self, events: list) -> None:
        for stream in list(self._blocked.values()):
            if self.send_window <= 0:
                break
            self._send_outbound(stream, events)

    def _closed_locally(self, stream: _Stream) -> None:
        """The server's END_STREAM is sent: the stream ends, the client's side with it."""
        if not stream.remote_closed:
            self.out.append(f.rst_stream(stream.stream_id, f.NO_ERROR))  # the client need not send the rest
            self._forget(stream, reset_by_server=True)
        else:
            self._forget(stream, reset_by_server=False)

    def _forget(self, stream: _Stream, reset_by_server: bool) -> list:
        """Drop a stream; returns the tokens of its DATA never sent."""
        stream_id = stream.stream_id
        if self.streams.pop(stream_id, None) is None:
            return []
        self._remember_closed(stream_id, reset_by_server)
        unsent = []
        if stream.outbound:
            self._blocked.pop(stream_id, None)
            for data, _, token in stream.outbound:
                self.queued_output -= len(data)
                if token is not None:
                    unsent.append(token)
            stream.outbound = None
        stream.trailers = None
        return unsent

    def _remember_closed(self, stream_id: int, reset_by_server: bool) -> None:
        closed = self._closed_ids
        closed[stream_id] = reset_by_server
        if len(closed) > _CLOSED_IDS_KEPT:
            del closed[next(iter(closed))]


def _unpad(flags: int, payload: bytes) -> bytes:
    if flags & f.PADDED:
        if not payload or payload[0] >= len(payload):
            raise ProtocolError(f.PROTOCOL_ERROR, "padding as long as the frame")
        return payload[1 : len(payload) - payload[0]]
    return payload
