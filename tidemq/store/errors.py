"""Errors the store raises.  Each says whose fault it is:

- `InvalidMessageError`: the caller passed a message the store will not take (nothing stored, no
  queue offset consumed);
- `StoreLockedError`, `StoreClosedError`: misuse of the store;
- `CorruptStoreError`: the environment damaged the files; the message names the offset and the fix;
- `FlushTimeoutError`: written but not confirmed durable within the sync-flush timeout;
- `StoreIOError`: the disk refused a write (full, read-only); nothing was stored.
"""


class StoreError(Exception):
    """Base class of the store's errors."""


class InvalidMessageError(StoreError, ValueError):
    pass


class StoreLockedError(StoreError):
    pass


class StoreClosedError(StoreError):
    pass


class CorruptStoreError(StoreError):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class FlushTimeoutError(StoreError):
    pass


class StoreIOError(StoreError, OSError):
    # set when a batch fails part way: how many of its messages were stored (the first ones),
    # and their PutResults
    stored: int
    results: list
