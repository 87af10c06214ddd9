"""What one HTTP/2 connection may make the server hold or do, and the defaults.

Every quantity a peer controls is bounded here: streams, header blocks, buffered request and
response bytes, control-frame answers the peer has not read, resets, and time.  The connection
(`connection.py`) enforces the per-connection ones; the asyncio adapter enforces time and the
number of connections."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # advertised in SETTINGS and enforced
    max_concurrent_streams: int = 1000  # streams a client may have open at once (REFUSED_STREAM beyond)
    stream_window: int = 4 << 20  # SETTINGS_INITIAL_WINDOW_SIZE: request octets in flight per stream
    connection_window: int = 16 << 20  # request octets in flight per connection
    max_frame_size: int = 16384  # SETTINGS_MAX_FRAME_SIZE (the protocol's default; h2spec assumes it)
    max_header_list_size: int = 1 << 16  # SETTINGS_MAX_HEADER_LIST_SIZE; also bounds a header block's octets
    header_table_size: int = 4096  # SETTINGS_HEADER_TABLE_SIZE (the protocol's default)
    # enforced without being advertised
    max_continuation_frames: int = 32  # CONTINUATION frames in one header block
    max_queued_control_frames: int = 10_000  # PING/SETTINGS acks and resets queued while the peer reads none
    max_queued_output: int = 64 << 20  # response octets waiting for the peer's flow-control window
    max_request_buffer: int = 32 << 20  # request octets held for incomplete messages, per connection
    early_reset_streams: int = 500  # after this many streams reset before their answer ...
    # ... the connection ends (ENHANCE_YOUR_CALM) once they are more than half of the streams opened
    # the adapter's: seconds, and connections per server
    preface_timeout_s: float = 10.0  # a new connection's time to send the connection preface
    idle_timeout_s: float = 120.0  # a connection without a stream this long is told GOAWAY and closed
    write_stall_timeout_s: float = 30.0  # a peer that reads nothing this long while we write is dropped
    max_connections: int = 4096  # connections served at once; more are closed as they arrive

    def __post_init__(self) -> None:
        if not 16384 <= self.max_frame_size <= (1 << 24) - 1:
            raise ValueError(f"max_frame_size {self.max_frame_size} is not in [16384, 2^24-1]")
        for name in ("stream_window", "connection_window"):
            if not 65535 <= getattr(self, name) <= (1 << 31) - 1:
                raise ValueError(f"{name} {getattr(self, name)} is not in [65535, 2^31-1]")
        for name in (
            "max_concurrent_streams",
            "max_header_list_size",
            "max_continuation_frames",
            "max_queued_control_frames",
            "max_queued_output",
            "max_request_buffer",
            "early_reset_streams",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("preface_timeout_s", "idle_timeout_s", "write_stall_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
