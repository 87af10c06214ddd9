"""HTTP/2 frames (RFC 9113 §4, §6): the 9-octet header, the frame types, flags, settings and error
codes, and encoders for the frames a server sends.  Pure: bytes in, values out; values in, bytes
out.

A frame is a 9-octet header, then `length` octets of payload:

    length (24 bits) | type (8) | flags (8) | R (1 bit, ignored) + stream id (31 bits)

`FrameBuffer` cuts a byte stream into whole frames however the bytes arrive (whole, or one at a
time), refusing a frame longer than the largest it accepts before its payload is buffered.
"""

from __future__ import annotations

import struct

# frame types (§6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# settings (§6.5.2)
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 4, 5, 6
# error codes (§7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED = range(6)
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM = range(6, 12)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_SIZE = 9
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384  # 2^14, the least SETTINGS_MAX_FRAME_SIZE
LARGEST_FRAME_SIZE = (1 << 24) - 1
MAX_WINDOW = (1 << 31) - 1

FRAME_HEADER = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
U32 = struct.Struct(">I")
SETTING = struct.Struct(">HI")
GOAWAY_FIELDS = struct.Struct(">II")  # last stream id, error code
PRIORITY_FIELDS = struct.Struct(">IB")  # exclusive bit + stream dependency, weight


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


def frame_header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length << 8 | ftype, flags, stream_id)


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in settings.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, GOAWAY_FIELDS.pack(last_stream_id, code) + debug)


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


class FrameSizeError(Exception):
    """A frame longer than the receiver accepts (a connection error of type FRAME_SIZE_ERROR)."""


class FrameBuffer:
    """Bytes in, whole frames out: `feed(data)` returns [(type, flags, stream id, payload), ...]
    for every frame completed, keeping a partial one.  Holds at most one frame header plus
    `max_frame_size` octets of payload."""

    __slots__ = ("max_frame_size", "_pending", "_needed")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._pending = bytearray()  # the start of an incomplete frame
        self._needed = HEADER_SIZE  # octets `_pending` must reach before a frame can complete

    def buffered(self) -> int:
        return len(self._pending)

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        pending = self._pending
        if pending:
            pending += data
            if len(pending) < self._needed:
                return []
            data = bytes(pending)
            pending.clear()
        frames = []
        size, position = len(data), 0
        unpack, limit = FRAME_HEADER.unpack_from, self.max_frame_size
        while size - position >= HEADER_SIZE:
            length_type, flags, stream_id = unpack(data, position)
            length = length_type >> 8
            if length > limit:
                raise FrameSizeError(f"a frame of {length} octets, above the {limit} accepted")
            end = position + HEADER_SIZE + length
            if end > size:
                self._needed = HEADER_SIZE + length
                break
            frames.append((length_type & 0xFF, flags, stream_id & 0x7FFFFFFF, data[position + HEADER_SIZE : end]))
            position = end
        else:
            self._needed = HEADER_SIZE
        if position < size:
            pending += data[position:] if position else data
        return frames
