"""Flush policies: when appended bytes become durable.

- async: a background thread flushes every `flush_interval_ms`; a put returns once written.
- sync (group commit): a put waits until an fsync covers its bytes.  Putters that arrive while
  an fsync is running share the next one, so N concurrent putters cost far fewer than N fsyncs.

Ownership: `GroupCommit._cond` guards `requested` and `flushed`; only the flusher thread calls
`CommitLog.flush`, and it reads `write_position` without the append lock (a stale value only
flushes less, and the requester waits for the next round).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .commit_log import CommitLog
from .errors import FlushTimeoutError

log = logging.getLogger(__name__)


class GroupCommit:
    def __init__(self, commit_log: CommitLog, on_flushed: Callable[[int], None], timeout_ms: int = 5000) -> None:
        self.commit_log = commit_log
        self.on_flushed = on_flushed
        self.timeout = timeout_ms / 1000.0
        self._cond = threading.Condition()
        self.requested = commit_log.flushed_position
        self.flushed = commit_log.flushed_position
        self.fsyncs = 0
        self.error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidemq-group-commit", daemon=True)
        self._thread.start()

    def wait_for(self, end_offset: int) -> None:
        """Block until the log is durable up to `end_offset`, or raise FlushTimeoutError."""
        with self._cond:
            if self.flushed >= end_offset:
                return
            if end_offset > self.requested:
                self.requested = end_offset
                self._cond.notify_all()
            deadline = time.monotonic() + self.timeout
            while self.flushed < end_offset:
                if self.error is not None:
                    raise FlushTimeoutError(f"flush failed: {self.error}") from self.error
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    raise FlushTimeoutError(
                        f"bytes up to offset {end_offset} not flushed within {self.timeout:.1f}s "
                        f"(flushed up to {self.flushed}); the message is written and may survive"
                    )
                self._cond.wait(remaining)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.requested <= self.flushed and not self._stopping:
                    self._cond.wait()
                if self._stopping and self.requested <= self.flushed:
                    return
            try:
                flushed = self.commit_log.flush()
                self.fsyncs += 1
            except OSError as exc:  # the environment: report to every waiter
                log.error("commit-log fsync failed: %s", exc)
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                time.sleep(0.01)
                continue
            self.on_flushed(flushed)
            with self._cond:
                self.error = None
                self.flushed = max(self.flushed, flushed)
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()


class PeriodicService:
    """Runs `work()` every `interval` seconds on its own thread until stopped; `wake()` runs it
    at once."""

    def __init__(self, name: str, interval: float, work: Callable[[], None]) -> None:
        self.interval = interval
        self.work = work
        self._event = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._event.set()

    def _run(self) -> None:
        while not self._stopping:
            self._event.wait(self.interval)
            self._event.clear()
            if self._stopping:
                break
            try:
                self.work()
            except Exception:
                log.exception("%s failed", self._thread.name)

    def stop(self) -> None:
        self._stopping = True
        self._event.set()
        self._thread.join()
