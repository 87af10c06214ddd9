"""Faults injected into a dispatch worker process, for crash tests: where it dies, as if killed.

A `BatchBuilder` is given a `WorkerFaults` at construction (`faults=`), and has none otherwise;
it tells the object where it is (a unit written, an index append starting, handed-over units
being written) and the object ends the process there with CRASH_EXIT_CODE.  A worker process
takes its faults from the environment its coordinator passes on (`from_environment`):

    TIDEMQ_DISPATCH_WORKER_CRASH="N:MARKER"    the first worker to create the file MARKER dies
                                               after writing N units of its first batch; "N:"
                                               without a marker: every worker does
    TIDEMQ_DISPATCH_WORKER_CRASH="append:MARKER"    ... dies in its first index append to a file
                                               holding entries, its entries written, the header
                                               not
    TIDEMQ_DISPATCH_WORKER_CRASH="handover:MARKER"  ... dies halfway through writing the first
                                               units handed over to it (the marker is taken
                                               when they come)
"""

from __future__ import annotations

import os

import numpy as np

from ..index.index_file import HEADER, IndexFile

CRASH_ENV = "TIDEMQ_DISPATCH_WORKER_CRASH"
CRASH_EXIT_CODE = 75  # a worker ended by an injected fault


def _take(marker: str) -> bool:
    """Create the file `marker`; False if another process did first."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class WorkerFaults:
    def __init__(self, after_units: int = 0, in_append: bool = False, handover_marker: str | None = None) -> None:
        self.after_units = after_units  # units left to write before dying; 0: not armed
        self.in_append = in_append
        self._handover_marker = handover_marker
        self.in_handover = False

    @classmethod
    def from_environment(cls) -> WorkerFaults | None:
        crash = os.environ.get(CRASH_ENV)
        if not crash:
            return None
        kind, _, marker = crash.partition(":")
        if kind == "handover":
            return cls(handover_marker=marker)
        if marker and not _take(marker):
            return None
        if kind == "append":
            return cls(in_append=True)
        return cls(after_units=int(kind))

    @staticmethod
    def die() -> None:
        os._exit(CRASH_EXIT_CODE)

    def unit_written(self) -> None:
        """One unit written while `after_units` is armed: dies at the last."""
        self.after_units -= 1
        if not self.after_units:
            self.die()

    def append_and_die(self, index: IndexFile, hashes: np.ndarray, phys: np.ndarray, times: np.ndarray) -> None:
        """Append to `index` and die before its header says so (a file with chains a redo
        could break)."""
        before = index.mm[: HEADER.size]
        index.append(hashes, phys, times)
        index.mm[: HEADER.size] = before
        self.die()

    def handover_coming(self) -> bool:
        """Units handed over are about to be written: whether to die halfway through them (the
        first handover only, and only in the worker that takes the marker)."""
        marker, self._handover_marker = self._handover_marker, None
        if marker:
            self.in_handover = _take(marker)
        return self.in_handover
