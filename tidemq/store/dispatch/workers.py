"""A parallel-dispatch worker process (see parallel_dispatch): its loop (`worker_main`), and the
coordinator's handle on one (`WorkerProcess`), which starts it as

    python -P -m tidemq.store.dispatch.worker_entry READ_FD WRITE_FD CONSUMEQUEUE_DIR UNITS_PER_FILE INDEX(0|1) OWNER OWNERS

(an entry point apart from this module: the store package imports this one, and `-m` on a module
already imported runs a second copy of it, with a RuntimeWarning in every worker).

It reads the file sizes of the queues whose files are not of the default size (a pickled dict),
then pickled `BatchTask`s, `IndexAppend` requests and the `UnitsHandover`s of the queues it owns
(worker OWNER of OWNERS) from READ_FD, and answers `BatchResult`s, `IndexAppended` and
`UnitsWritten` on WRITE_FD (see dispatch_messages) until it reads None or the pipe closes (its
coordinator is gone).  Each worker process has its own `BatchBuilder`.  The coordinator keeps its
workers in a `WorkerPool`.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..queues import open_files
from . import builder as batch_builder
from .builder import DIRECT_QUEUES, BatchBuilder
from .faults import WorkerFaults
from .messages import (
    BatchTask,
    Channel,
    IndexAppend,
    IndexAppended,
    UnitsHandover,
    UnitsWritten,
)
from .requests import QueueKey

# a worker's budget of queue-file mappings, when set (tests: with a small one, workers hand the
# other workers' queues over, as with more queues than half the usual budget)
MAPPINGS_ENV = "TIDEMQ_DISPATCH_WORKER_MAPPINGS"
# glibc's malloc in a worker process (the coordinator puts these in its environment): arrays of
# up to 32 MiB come from the heap, and up to 128 MiB of freed heap stays mapped; and the worker
# touches WARM_HEAP_BYTES of heap as it starts (`_warm_heap`).  By default glibc maps arrays past
# 128 KB afresh and unmaps them when freed, so a new worker's first batches, and a worker whose
# batches shrink and grow again, fault in every page they use.  The price: a worker keeps about
# WARM_HEAP_BYTES more resident
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
WARM_HEAP_BYTES = 64 << 20  # about twice what a 16 MiB batch uses at once
RESULT_PIPE_BYTES = 1 << 20  # a worker's pipes, each way: room for an answer naming 20,000 queues
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux


def _warm_heap(size: int, piece: int = 8 << 20) -> None:
    """Touch `size` bytes of heap and free them (see MALLOC_ENV): pieces below the mmap threshold,
    so that they come from the heap, which then keeps them, and later arrays reuse pages already
    there instead of faulting in new ones."""
    pieces = [np.ones(piece, np.uint8) for _ in range(size // piece)]
    del pieces


def worker_main(
    conn: Channel,
    consume_queue_root: str,
    default_units_per_file: int,
    index_enabled: bool,
    owner: int = 0,
    owners: int = 1,
) -> None:
    """A worker process, worker `owner` of `owners`: take the sizes of the queues whose files are
    not of the default size (the first message), then build each task it receives and send back
    the result, keeping the index entries until asked to append them; write the units other
    workers hand over; None stops it.  Messages already sent are read before each build and
    between its decoding and its writing, and append requests and handed-over units among them
    are dealt with at once: the coordinator waits for them, the builds can wait."""
    open_files.raise_limit()  # the more queue files stay mapped between batches, the better
    _warm_heap(WARM_HEAP_BYTES)
    try:
        units_per_file = conn.recv()
    except EOFError:
        return  # the coordinator is gone
    builder = BatchBuilder(
        consume_queue_root, default_units_per_file, index_enabled, units_per_file, WorkerFaults.from_environment()
    )
    builder.coordinator_pid = os.getppid()
    # its only cache of mappings; compiled ones hold no descriptor, so the open-file limit does
    # not bound them: with 10,000 queues and a limit of 20,000, each of 2 workers stopped mapping
    # the other's files at 9,872 mappings (half its budget) and handed 128 queues' units over in
    # every batch
    builder.max_queue_files = int(
        os.environ.get(MAPPINGS_ENV)
        or open_files.mapping_budget(1.0, descriptors=batch_builder.MAPPINGS_HOLD_DESCRIPTORS)
    )
    builder.hold_index = True
    builder.owner = owner
    builder.owners = owners
    builder.direct_queues = DIRECT_QUEUES
    tasks: deque[BatchTask] = deque()
    received: deque = deque()  # messages read while an answer waited for room in the pipe
    stopping = False
    building: int | None = None  # the batch under way
    waiting: dict[int, IndexAppend] = {}  # append requests for batches not built yet

    def append(request: IndexAppend) -> IndexAppended:
        try:
            return builder.append_index(request)
        except Exception as exc:  # an I/O error: the coordinator undoes it and builds the batch itself
            builder.forget_index_files()  # the coordinator may cut back and remake them
            return IndexAppended(request.batch_id, 0, 0, 0, 0, batch_builder.failure(exc))

    def send(answer, *more) -> None:
        conn.send_reading(answer, received.append, *more)

    def write_handover(handover: UnitsHandover) -> None:
        try:
            builder.write_handover(handover)
            answer = UnitsWritten(handover.batch_id)
        except Exception as exc:  # an I/O error: the coordinator writes them itself
            answer = UnitsWritten(handover.batch_id, batch_builder.failure(exc))
        send(answer)

    def read(block: bool) -> None:
        """Take the messages sent so far (waiting for one if `block`): answer append requests
        and write handed-over units at once, queue tasks."""
        nonlocal stopping
        while not stopping and (block or received or conn.poll()):
            block = False
            if received:
                message = received.popleft()
            else:
                try:
                    message = conn.recv()
                except EOFError:
                    message = None
            if message is None:
                stopping = True
            elif message == "ping":
                send("pong")
            elif type(message) is UnitsHandover:
                write_handover(message)
            elif type(message) is IndexAppend:
                if message.batch_id == building or any(task.batch_id == message.batch_id for task in tasks):
                    waiting[message.batch_id] = message  # the head, not built yet: appended once it is
                else:
                    send(append(message))
            else:
                tasks.append(message)

    # the head's append is answered between two steps of a build too: the coordinator waits for it
    builder.between_steps = lambda: read(False)
    os.set_blocking(conn.write_fd, False)  # see Channel.send_reading
    try:
        while True:
            read(not tasks)
            if stopping:
                return
            if not tasks:
                continue
            task = tasks.popleft()
            building = task.batch_id
            try:
                result = builder.build(task)
            except Exception as exc:  # an I/O error: the coordinator logs it and stalls there
                result = batch_builder.failed_result(task, batch_builder.failure(exc))
            building = None
            request = waiting.pop(task.batch_id, None)
            if request is None:
                send(result)
            else:
                # the head: its entries go in now, while they are in the cache, and both answers
                # go together (the coordinator can do nothing with the batch before the append)
                appended = append(request) if result.index_held else IndexAppended(task.batch_id, 0, 0, 0, 0)
                send(result, appended)
    except EOFError:
        return  # the coordinator is gone
    finally:
        builder.close()


class WorkerProcess:
    """A worker process (`python -m tidemq.store.dispatch.worker_entry`, talking pickled messages over
    two pipes): a fresh interpreter, so the threaded store process is never forked and the
    caller's main module is never re-imported."""

    __slots__ = ("number", "process", "conn")

    def __init__(
        self,
        consume_queue_root: str,
        units_per_file: int,
        file_sizes: dict[QueueKey, int],
        index_enabled: bool,
        number: int,
        workers: int,
    ) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        if _F_SETPIPE_SZ is not None:
            for pipe_end in (from_child_w, to_child_w):
                try:
                    # an answer naming many queues, and the units it hands over, are hundreds
                    # of KB: in a default pipe the worker would wait to send it until the
                    # coordinator had committed the batches before, instead of building its
                    # next batch meanwhile; the other way, the coordinator would wait to forward
                    # the units handed over until the owner read them
                    fcntl.fcntl(pipe_end, _F_SETPIPE_SZ, RESULT_PIPE_BYTES)
                except OSError:  # above the system's limit for pipes (fs.pipe-max-size): the default
                    pass
        package_root = str(Path(__file__).resolve().parents[3])  # the directory holding tidemq/
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # NumPy's OpenBLAS threads poll while idle; a worker never multiplies matrices
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        for name, value in MALLOC_ENV.items():  # the worker's heap is kept (see MALLOC_ENV)
            env.setdefault(name, value)
        try:
            self.process = subprocess.Popen(
                # -P: not the working directory first on the module path (as -m puts it), so that
                # the worker runs this tidemq (PYTHONPATH), not one the directory happens to hold
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "tidemq.store.dispatch.worker_entry",
                    str(to_child_r),
                    str(from_child_w),
                    consume_queue_root,
                    str(units_per_file),
                    "1" if index_enabled else "0",
                    str(number),
                    str(workers),
                ],
                pass_fds=(to_child_r, from_child_w),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.conn = Channel(from_child_r, to_child_w)
        self.number = number  # it owns the queues `owner_of` gives `number` (a replacement takes its number)
        try:
            self.conn.send(file_sizes)  # the worker's first message (see worker_main)
        except OSError:
            pass  # it died at once: its closed pipe tells the coordinator

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class WorkerPool:
    """The coordinator's `count` worker processes, worker k of them owning the queues `owner_of`
    gives k: started together (`start`), each answer pipe registered once with one `select.poll`
    (`ready` waits on it: not a selector built for each wait), a dead one's pipes closed and
    unregistered (`retire`, before a descriptor's number is another's) and the worker replaced by
    one of the same number (`replace`) or let go (`remove`), all stopped by `close`.  Ownership:
    the coordinator's thread alone."""

    def __init__(
        self,
        count: int,
        consume_queue_root: str,
        units_per_file: int,
        file_sizes: Callable[[], dict[QueueKey, int]],
        index_enabled: bool,
    ) -> None:
        self.count = count
        self.workers: list[WorkerProcess] = []
        self._consume_queue_root = consume_queue_root
        self._units_per_file = units_per_file
        self._file_sizes = file_sizes  # read as each worker starts: a replacement gets the sizes of now
        self._index_enabled = index_enabled
        self._poller = select.poll()
        self._watched: dict[int, WorkerProcess] = {}  # by the descriptor of its answer pipe

    def start(self) -> bool:
        """Start the workers unless they are running; True if they were started now."""
        if self.workers:
            return False
        self.workers = [self._start(number) for number in range(self.count)]
        return True

    def _start(self, number: int) -> WorkerProcess:
        worker = WorkerProcess(
            self._consume_queue_root, self._units_per_file, self._file_sizes(), self._index_enabled, number, self.count
        )
        self._poller.register(worker.conn.read_fd, select.POLLIN)
        self._watched[worker.conn.read_fd] = worker
        return worker

    def wait_ready(self) -> None:
        """Wait until each worker has answered once."""
        for worker in self.workers:
            worker.conn.send("ping")
        for worker in self.workers:
            assert worker.conn.recv() == "pong"

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def numbered(self, number: int) -> WorkerProcess | None:
        return next((w for w in self.workers if w.number == number), None)

    def ready(self) -> list[WorkerProcess]:
        """The workers whose answer pipes have something to read (or have closed), waiting for
        one if none has."""
        watched = self._watched
        return [watched[fd] for fd, _ in self._poller.poll() if fd in watched]

    def watching(self, worker: WorkerProcess) -> bool:
        """False once `worker` is retired (replaced meanwhile)."""
        return self._watched.get(worker.conn.read_fd) is worker

    def retire(self, worker: WorkerProcess) -> None:
        """Unregister a worker's answer pipe and close its pipes (it died, or is stopping)."""
        if self.watching(worker):
            del self._watched[worker.conn.read_fd]
            self._poller.unregister(worker.conn.read_fd)
        worker.conn.close()

    def replace(self, dead: WorkerProcess) -> WorkerProcess:
        """A new worker of `dead`'s number, in its place (`dead` retired already)."""
        replacement = self._start(dead.number)
        self.workers[self.workers.index(dead)] = replacement
        return replacement

    def remove(self, dead: WorkerProcess) -> None:
        self.workers.remove(dead)

    def close(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop, wait up to `timeout` seconds for all of them, kill the rest."""
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (OSError, EOFError):
                pass
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            self.retire(worker)
        self.workers = []
