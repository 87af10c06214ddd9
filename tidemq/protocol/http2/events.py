"""What an `H2Connection` tells the application: one class per event, plain values."""

from __future__ import annotations

__all__ = ["DataReceived", "DataSent", "RequestReceived", "StreamClosed", "StreamReset", "TrailersReceived"]


class RequestReceived:
    """A client opened stream `stream_id` with valid request headers."""

    __slots__ = ("stream_id", "headers", "end_stream")

    def __init__(self, stream_id: int, headers: list, end_stream: bool) -> None:
        self.stream_id, self.headers, self.end_stream = stream_id, headers, end_stream


class DataReceived:
    """Request octets (padding removed), to be acknowledged once consumed."""

    __slots__ = ("stream_id", "data", "end_stream")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.stream_id, self.data, self.end_stream = stream_id, data, end_stream


class TrailersReceived:
    """The client ended its side of `stream_id` with a header block (its fields are dropped)."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class StreamReset:
    """`stream_id` ended before the server finished it: reset by the client (`remote`) or by the
    server for a stream error.  `unsent`: the tokens of the DATA it never sent."""

    __slots__ = ("stream_id", "error_code", "remote", "unsent")

    def __init__(self, stream_id: int, error_code: int, remote: bool, unsent: list) -> None:
        self.stream_id, self.error_code, self.remote, self.unsent = stream_id, error_code, remote, unsent


class DataSent:
    """The DATA queued with `token` on `stream_id` has been sent."""

    __slots__ = ("stream_id", "token")

    def __init__(self, stream_id: int, token) -> None:
        self.stream_id, self.token = stream_id, token


class StreamClosed:
    """The server's END_STREAM on `stream_id`, which waited for flow-control window, is sent."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
