"""Request and trailer header lists as RFC 9113 §8.2-8.3 allows them: pseudo-headers known, once,
before the regular fields, and the ones a request needs; field names lowercase tokens; no
connection-specific fields; `te` only "trailers"; no NUL, CR or LF in a value, nor space at its
ends.  A malformed list is a stream error of type PROTOCOL_ERROR (`StreamError`)."""

from __future__ import annotations

import re

from . import frames as f

REQUEST_PSEUDO_HEADERS = frozenset((":method", ":scheme", ":path", ":authority"))
CONNECTION_SPECIFIC = frozenset(("connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade"))
_VALID_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+\Z").match  # RFC 9110 token, lowercase (RFC 9113 §8.2.1)
_INVALID_VALUE = re.compile(r"[\x00\r\n]|\A[ \t]|[ \t]\Z").search  # RFC 9113 §8.2.1
_KNOWN_NAMES_KEPT = 4096  # valid field names remembered (a set lookup instead of a match)


class StreamError(Exception):
    """The peer broke the protocol for one stream: it is reset with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_request_headers(headers: list[tuple[str, str]], known_names: set) -> int | None:
    """RFC 9113 §8.2-8.3 for a request's header list: raises StreamError(PROTOCOL_ERROR) if it is
    malformed; returns its content-length, if it has one."""
    pseudo: dict[str, str] = {}
    regular = False
    content_length = None
    for name, value in headers:
        if name[:1] == ":":
            if regular:
                raise StreamError(f.PROTOCOL_ERROR, f"pseudo-header {name} after a regular field")
            if name not in REQUEST_PSEUDO_HEADERS:
                raise StreamError(f.PROTOCOL_ERROR, f"pseudo-header {name} in a request")
            if name in pseudo:
                raise StreamError(f.PROTOCOL_ERROR, f"pseudo-header {name} twice")
            pseudo[name] = value
        else:
            regular = True
            _check_field(name, known_names)
            if name in CONNECTION_SPECIFIC:
                raise StreamError(f.PROTOCOL_ERROR, f"connection-specific field {name}")
            if name == "te" and value != "trailers":
                raise StreamError(f.PROTOCOL_ERROR, f"te: {value!r} (only 'trailers' is allowed)")
            if name == "content-length":
                if not value.isdigit() or (content_length is not None and int(value) != content_length):
                    raise StreamError(f.PROTOCOL_ERROR, f"content-length: {value!r}")
                content_length = int(value)
        if _INVALID_VALUE(value):
            raise StreamError(f.PROTOCOL_ERROR, f"the value of {name} has a forbidden character or space")
    if pseudo.get(":method") == "CONNECT":
        if ":scheme" in pseudo or ":path" in pseudo or ":authority" not in pseudo:
            raise StreamError(f.PROTOCOL_ERROR, "CONNECT with :scheme or :path, or without :authority")
    elif ":method" not in pseudo or ":scheme" not in pseudo or not pseudo.get(":path"):
        raise StreamError(f.PROTOCOL_ERROR, "a request without :method, :scheme or a non-empty :path")
    return content_length


def check_trailers(headers: list[tuple[str, str]], known_names: set) -> None:
    for name, value in headers:
        if name[:1] == ":":
            raise StreamError(f.PROTOCOL_ERROR, f"pseudo-header {name} in trailers")
        _check_field(name, known_names)
        if name in CONNECTION_SPECIFIC:
            raise StreamError(f.PROTOCOL_ERROR, f"connection-specific field {name} in trailers")
        if _INVALID_VALUE(value):
            raise StreamError(f.PROTOCOL_ERROR, f"the value of {name} has a forbidden character or space")


def _check_field(name: str, known_names: set) -> None:
    if name not in known_names:
        if not _VALID_NAME(name):
            raise StreamError(f.PROTOCOL_ERROR, f"field name {name!r} is not a lowercase token")
        if len(known_names) < _KNOWN_NAMES_KEPT:
            known_names.add(name)
