"""Client-visible status codes, declared once.

The numbers are those of `apache.rocketmq.v2.Code`, so the gRPC adapter passes them through; the
broker itself never imports protobuf.  A `BrokerError` carries one of them and says why."""

from __future__ import annotations

import enum
import errno
import logging


class Code(enum.IntEnum):
    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_ACCESS_POINT = 40001
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_TAG = 40004
    ILLEGAL_MESSAGE_KEY = 40005
    ILLEGAL_MESSAGE_GROUP = 40006
    ILLEGAL_MESSAGE_PROPERTY_KEY = 40007
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_MESSAGE_ID = 40009
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014
    UNRECOGNIZED_CLIENT_TYPE = 40015
    MESSAGE_CORRUPTED = 40016
    CLIENT_ID_REQUIRED = 40017
    ILLEGAL_POLLING_TIME = 40018
    ILLEGAL_OFFSET = 40019
    ILLEGAL_LITE_TOPIC = 40020
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    CONSUMER_GROUP_NOT_FOUND = 40403
    REQUEST_TIMEOUT = 40800
    PAYLOAD_TOO_LARGE = 41300
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    TOO_MANY_REQUESTS = 42900
    LITE_TOPIC_QUOTA_EXCEEDED = 42901
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED = 42902
    MESSAGE_PROPERTIES_TOO_LARGE = 43101
    INTERNAL_ERROR = 50000
    INTERNAL_SERVER_ERROR = 50001
    NOT_IMPLEMENTED = 50100
    PROXY_TIMEOUT = 50400
    MASTER_PERSISTENCE_TIMEOUT = 50401
    UNSUPPORTED = 50500


# A write the broker's disk refused for want of space (its commit log or pop journal): the call did
# not take effect and may be retried once space is freed.  RocketMQ's broker answers such a put
# SERVICE_NOT_AVAILABLE ("the broker's disk is full"), which its proxy's table does not map (it
# becomes INTERNAL_SERVER_ERROR); the apache.rocketmq.v2 code for "busy, retry later" is
# TOO_MANY_REQUESTS (the proxy's for SYSTEM_BUSY), gRPC's RESOURCE_EXHAUSTED, whose meaning
# includes a full file system.
DISK_FULL = Code.TOO_MANY_REQUESTS
_NO_SPACE = frozenset((errno.ENOSPC, errno.EDQUOT))


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """Log that `what` failed: a full disk in one line (it is expected, and said as such), any
    other failure with its traceback."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        logger.error("%s: the disk is full (%s)", what, exc.strerror or exc)
    else:
        logger.error(what, exc_info=exc)


def disk_refused(exc: OSError, what: str) -> BrokerError:
    """What a client is told when the broker's disk refused the write of `what` (nothing of the
    call took effect): DISK_FULL for want of space, else INTERNAL_SERVER_ERROR."""
    reason = exc.strerror or str(exc)
    if exc.errno in _NO_SPACE:
        return BrokerError(
            DISK_FULL, f"the broker's disk is full, {what} not recorded ({reason}); retry once space is freed"
        )
    return BrokerError(Code.INTERNAL_SERVER_ERROR, f"the broker's disk refused {what} ({reason}); retry later")


class BrokerError(Exception):
    """A request the broker refuses; `code` is what the client is told."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"BrokerError({self.code.name}, {self.message!r})"

    @classmethod
    def from_name(cls, name: str, message: str) -> BrokerError:
        return cls(Code[name] if name in Code.__members__ else Code.INTERNAL_ERROR, message)
