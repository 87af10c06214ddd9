"""tidemq.store: the embedded message store (CommitLog, ConsumeQueues, dispatch, recovery).

Synchronous, no network.  The public API is what this module exports."""

from .dispatch.requests import DispatchRequest, DispatchSink
from .dispatch.sequential import Dispatcher
from .errors import (
    CorruptStoreError,
    FlushTimeoutError,
    InvalidMessageError,
    StoreClosedError,
    StoreError,
    StoreIOError,
    StoreLockedError,
)
from .format import record
from .message_store import (
    FLUSH_ASYNC,
    FLUSH_SYNC,
    DispatchLag,
    GetResult,
    Message,
    MessageStore,
    PutResult,
    StoreConfig,
)
from .queues.consume_queue import ConsumeQueue, Unit
from .queues.open_files import raise_limit as raise_open_file_limit

__all__ = [
    "record",
    "ConsumeQueue",
    "Unit",
    "DispatchRequest",
    "DispatchSink",
    "Dispatcher",
    "CorruptStoreError",
    "FlushTimeoutError",
    "InvalidMessageError",
    "StoreClosedError",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "FLUSH_ASYNC",
    "FLUSH_SYNC",
    "DispatchLag",
    "GetResult",
    "raise_open_file_limit",
    "Message",
    "MessageStore",
    "PutResult",
    "StoreConfig",
]
