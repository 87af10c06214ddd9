"""The gRPC server under the broker's services: grpcio's core driven from one thread, calls
answered on the event loop.

Why not grpc.aio: it hands every completion of a call (about 4 for a unary call, 7 for a streamed
receive of one message) from its poller thread to the event loop through a socket, and runs each
call as a task with a future per batch of operations.  On a 2-core machine that measured 230-300 us
of server CPU per empty unary call; the broker's own work per message is a fraction of that.

Here one thread waits on the completion queue and does the bookkeeping of a call itself: it
requests the next call, asks for the request message, chains the writes of a stream and forgets
finished batches.  The event loop sees a call once, when its request has arrived (several calls per
wake-up under load), and answers a unary call with one batch: initial metadata, the response and
the status.  The same empty call then costs about 80-100 us of server CPU.

The core is reached through grpcio's Cython layer (`grpc._cython.cygrpc`), the API grpcio's own
synchronous server is written on.  It is not public, so `pyproject.toml` holds grpcio to the
release series this is tested with.

Threads and ownership: callbacks of `_Tag.on_event` run on the completion-queue thread; they are
short and never touch the broker.  Everything else runs on the event loop.  The two share `_inbox`
(the thread appends callables, the loop pops them) and start batches on calls, which the core
serialises per call.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from grpc._cython import cygrpc

log = logging.getLogger(__name__)

UNARY, SERVER_STREAM, BIDI_STREAM = "unary", "server-stream", "bidi-stream"
_NO_FLAGS = 0
_NO_METADATA = ()
_OK = cygrpc.StatusCode.ok
CANCELLED_CALLS_WAIT_S = 5.0  # at shutdown, how long cancelled calls get to end


@dataclass(frozen=True)
class Method:
    """How to serve one method.  `handler(request, rpc)`:
    - UNARY: returns the response, or a coroutine that does;
    - SERVER_STREAM: a coroutine returning the list of responses (written in order, then the
      status); it may set `rpc.on_unwritten(count)`, told how many were not written if the stream
      breaks;
    - BIDI_STREAM: `handler(rpc)`, a coroutine that reads with `await rpc.read()` (None at the
      end) and writes with `await rpc.write(message)`; the status follows its return."""

    kind: str
    handler: Callable
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]


class Rpc:
    """One call, as a handler sees it."""

    __slots__ = ("server", "call", "method", "metadata", "deadline", "request", "task", "cancelled", "on_unwritten",
                 "_initial_sent")

    def __init__(self, server: "GrpcServer", call, method: Method, metadata, deadline: float) -> None:
        self.server = server
        self.call = call
        self.method = method
        self.metadata = metadata  # ((key, value), ...)
        self.deadline = deadline  # seconds since the epoch
        self.request = None
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.on_unwritten: Callable[[int], None] | None = None
        self._initial_sent = False

    def metadata_value(self, key: str) -> str:
        for k, v in self.metadata:
            if k == key:
                return v
        return ""

    def peer(self) -> str:
        """"ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412"."""
        peer = self.call.peer()
        return peer.decode() if isinstance(peer, bytes) else peer

    def time_remaining(self) -> float:
        return self.deadline - time.time()

    def _initial(self) -> tuple:
        if self._initial_sent:
            return ()
        self._initial_sent = True
        return (cygrpc.SendInitialMetadataOperation(_NO_METADATA, _NO_FLAGS),)

    # -- bidi streams (event loop) --

    def read(self) -> asyncio.Future:
        """The next request message, None once the client has finished or gone."""
        future = self.server.loop.create_future()
        self._start(((cygrpc.ReceiveMessageOperation(_NO_FLAGS),), _Read(self.server, future, self.method.decode)))
        return future

    def write(self, message) -> asyncio.Future:
        """Resolves to whether the message was written."""
        future = self.server.loop.create_future()
        ops = (*self._initial(), cygrpc.SendMessageOperation(self.method.encode(message), _NO_FLAGS))
        self._start((ops, _Wrote(self.server, future)))
        return future

    def _start(self, batch) -> None:
        self.server._start_batch(self.call, *batch)


class _Tag:
    """What a batch's completion does, on the completion-queue thread."""

    __slots__ = ()

    def on_event(self, event) -> None:
        pass

    def on_failure(self) -> None:
        """The batch could not be started."""


_DONE = _Tag()  # a finished call's last batch: nothing left to do


class _Received(_Tag):
    __slots__ = ("rpc",)

    def __init__(self, rpc: Rpc) -> None:
        self.rpc = rpc

    def on_event(self, event) -> None:
        rpc = self.rpc
        rpc.request = event.batch_operations[0].message() if event.success else None
        rpc.server._post(rpc.server._run, rpc)


class _Closed(_Tag):
    """A streaming call ended; if the client cancelled it (or went away), its handler is
    cancelled."""

    __slots__ = ("rpc",)

    def __init__(self, rpc: Rpc) -> None:
        self.rpc = rpc

    def on_event(self, event) -> None:
        if event.batch_operations[0].cancelled():
            self.rpc.server._post(self.rpc.server._cancel, self.rpc)


class _Writes(_Tag):
    """The responses of a server stream, one batch after the other (the core takes one message at a
    time); the last carries the status."""

    __slots__ = ("rpc", "pending", "written")

    def __init__(self, rpc: Rpc, pending: collections.deque) -> None:
        self.rpc = rpc
        self.pending = pending
        self.written = 0

    def start_next(self) -> None:
        rpc, pending = self.rpc, self.pending
        data = pending.popleft()
        if pending:
            ops = (*rpc._initial(), cygrpc.SendMessageOperation(data, _NO_FLAGS))
            tag = self
        else:
            ops = (*rpc._initial(), cygrpc.SendMessageOperation(data, _NO_FLAGS),
                   cygrpc.SendStatusFromServerOperation(_NO_METADATA, _OK, b"", _NO_FLAGS))
            tag = _DONE
        if not rpc.server._start_batch(rpc.call, ops, tag):
            self.on_failure(len(pending) + 1)

    def on_event(self, event) -> None:
        if not event.success:
            self.on_failure(len(self.pending) + 1)
            return
        self.start_next()

    def on_failure(self, unwritten: int = 0) -> None:
        rpc = self.rpc
        if rpc.on_unwritten is not None and unwritten:
            rpc.server._post(rpc.on_unwritten, unwritten)


class _Read(_Tag):
    __slots__ = ("server", "future", "decode")

    def __init__(self, server: "GrpcServer", future: asyncio.Future, decode=None) -> None:
        self.server, self.future, self.decode = server, future, decode

    def on_event(self, event) -> None:
        data = event.batch_operations[0].message() if event.success else None
        if data is not None:
            try:
                data = self.decode(data)
            except Exception:  # not a message of this method: the stream ends
                log.warning("undecodable message on a %s stream", self.decode.__qualname__)
                data = None
        self.server._post(_resolve, self.future, data)

    def on_failure(self) -> None:
        self.server._post(_resolve, self.future, None)


class _Wrote(_Read):
    __slots__ = ()

    def on_event(self, event) -> None:
        self.server._post(_resolve, self.future, bool(event.success))

    def on_failure(self) -> None:
        self.server._post(_resolve, self.future, False)


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


_REQUEST_CALL = _Tag()
_SHUTDOWN = _Tag()


class GrpcServer:
    """Serves `methods` ({"/package.Service/Method": Method}) on the running event loop."""

    def __init__(self, methods: dict[str, Method], options: tuple = ()) -> None:
        self.methods = {path.encode(): method for path, method in methods.items()}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._cq = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(tuple(options), False)
        self._server.register_completion_queue(self._cq)
        self._inbox: collections.deque = collections.deque()
        self._wake_pending = False
        self._thread: threading.Thread | None = None
        self._stopping = False
        # No batch starts once the completion queue is shut down (the core forbids new work on it
        # then).  The queue is shut down on the event loop's thread, so batches started there need
        # only look at `_closed`; the completion-queue thread starts its batches under this lock.
        self._batch_lock = threading.Lock()
        self._loop_thread: int | None = None
        self._closed = False
        self._shut_down: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()

    def add_insecure_port(self, address: str) -> int:
        return self._server.add_http2_port(address.encode())

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._shut_down = self.loop.create_future()
        self._server.start()
        self._server.request_call(self._cq, self._cq, _REQUEST_CALL)
        self._thread = threading.Thread(target=self._poll, name="grpc-completion-queue", daemon=True)
        self._thread.start()

    async def stop(self, grace: float) -> None:
        """Accept no new call; give the calls in flight `grace` seconds, then cancel them.  Then
        shut the completion queue down, let its thread take the last completions, and destroy the
        server (in that order: the core wants the server shut down before its queue)."""
        if self._thread is None:
            return
        with self._batch_lock:
            self._stopping = True
            self._server.shutdown(self._cq, _SHUTDOWN)
        try:
            await asyncio.wait_for(asyncio.shield(self._shut_down), grace)
        except asyncio.TimeoutError:
            self._server.cancel_all_calls()
            try:
                await asyncio.wait_for(asyncio.shield(self._shut_down), CANCELLED_CALLS_WAIT_S)
            except asyncio.TimeoutError:
                log.warning("gRPC calls still open %.0f s after cancelling them; stopping anyway",
                            CANCELLED_CALLS_WAIT_S)
                return
        with self._batch_lock:
            self._closed = True
            self._cq.shutdown()
        await self.loop.run_in_executor(None, self._thread.join)
        self._thread = None
        self._server.destroy()

    def _start_batch(self, call, operations: tuple, tag: _Tag) -> bool:
        """Start a batch of operations on a call (either thread); False, after telling the tag, if
        the call is over or the server stopped."""
        if threading.get_ident() == self._loop_thread:  # `stop` cannot close the queue meanwhile
            if not self._closed and self._start(call, operations, tag):
                return True
        else:
            with self._batch_lock:
                if not self._closed and self._start(call, operations, tag):
                    return True
        tag.on_failure()
        return False

    @staticmethod
    def _start(call, operations: tuple, tag: _Tag) -> bool:
        try:
            call.start_server_batch(operations, tag)
            return True
        except Exception:  # the call is over (cancelled, or the server shut down)
            return False

    # -- the completion-queue thread --

    def _poll(self) -> None:
        cq = self._cq
        operation_complete = cygrpc.CompletionType.operation_complete
        while True:
            event = cq.poll()
            if event.completion_type != operation_complete:
                if event.completion_type == cygrpc.CompletionType.queue_shutdown:
                    return
                continue
            tag = event.tag
            try:
                if tag is _REQUEST_CALL:
                    self._accept(event)
                elif tag is _SHUTDOWN:  # every call is over
                    self._post(_resolve, self._shut_down, None)
                else:
                    tag.on_event(event)
            except Exception:
                log.exception("gRPC completion %r failed", tag)
            event = tag = None  # drop the call before waiting again

    def _accept(self, event) -> None:
        if not event.success:  # the server is shutting down
            return
        with self._batch_lock:
            if not self._stopping:
                self._server.request_call(self._cq, self._cq, _REQUEST_CALL)
        call = event.call
        method = self.methods.get(event.call_details.method)
        if method is None:
            self._start_batch(call, (
                cygrpc.SendInitialMetadataOperation(_NO_METADATA, _NO_FLAGS),
                cygrpc.ReceiveCloseOnServerOperation(_NO_FLAGS),
                cygrpc.SendStatusFromServerOperation(_NO_METADATA, cygrpc.StatusCode.unimplemented,
                                                     b"Method not found!", _NO_FLAGS),
            ), _DONE)
            return
        rpc = Rpc(self, call, method, event.invocation_metadata, event.call_details.deadline)
        if method.kind != UNARY:
            self._start_batch(call, (cygrpc.ReceiveCloseOnServerOperation(_NO_FLAGS),), _Closed(rpc))
        if method.kind == BIDI_STREAM:
            self._post(self._run, rpc)
        else:
            self._start_batch(call, (cygrpc.ReceiveMessageOperation(_NO_FLAGS),), _Received(rpc))

    def _post(self, function, *args) -> None:
        """Run `function(*args)` on the event loop; one wake-up of the loop carries every call
        posted until it runs."""
        self._inbox.append((function, args))
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nothing is waiting any more
                pass

    # -- the event loop --

    def _drain(self) -> None:
        self._wake_pending = False  # before draining: a call posted from now on wakes the loop again
        inbox = self._inbox
        for _ in range(len(inbox)):  # what arrives meanwhile waits for the next wake-up: others run first
            function, args = inbox.popleft()
            try:
                function(*args)
            except Exception:
                log.exception("gRPC call handling failed")

    def _run(self, rpc: Rpc) -> None:
        method = rpc.method
        if method.kind == BIDI_STREAM:
            self._spawn(rpc, self._stream(rpc))
            return
        if rpc.request is None:
            self._finish(rpc, cygrpc.StatusCode.internal, "exactly one request message is required")
            return
        try:
            request = method.decode(rpc.request)
        except Exception:
            self._finish(rpc, cygrpc.StatusCode.internal, "the request message cannot be decoded")
            return
        rpc.request = request
        respond = self._respond if method.kind == UNARY else self._write_stream
        try:
            response = method.handler(request, rpc)
        except Exception:
            log.exception("%s failed", method.handler.__name__)
            self._finish(rpc, cygrpc.StatusCode.unknown, "internal error")
            return
        if asyncio.iscoroutine(response):
            self._spawn(rpc, self._respond_later(rpc, response, respond))
        else:
            respond(rpc, response)

    def _spawn(self, rpc: Rpc, coroutine) -> None:
        task = rpc.task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _respond(self, rpc: Rpc, response) -> None:
        self._finish(rpc, _OK, message=rpc.method.encode(response))

    def _write_stream(self, rpc: Rpc, responses: list) -> None:
        if rpc.cancelled:
            if rpc.on_unwritten is not None:
                rpc.on_unwritten(len(responses))
            return
        if not responses:
            self._finish(rpc, _OK)
            return
        encode = rpc.method.encode
        _Writes(rpc, collections.deque(encode(r) for r in responses)).start_next()

    def _finish(self, rpc: Rpc, code, details: str = "", message: bytes | None = None) -> None:
        """End a call with its status (after `message`, the answer of a unary call, if given)."""
        ops = rpc._initial()
        if message is not None:
            ops += (cygrpc.SendMessageOperation(message, _NO_FLAGS),)
        ops += (cygrpc.SendStatusFromServerOperation(_NO_METADATA, code, details.encode(), _NO_FLAGS),)
        if rpc.method.kind == UNARY:
            ops += (cygrpc.ReceiveCloseOnServerOperation(_NO_FLAGS),)
        rpc._start((ops, _DONE))

    async def _respond_later(self, rpc: Rpc, awaitable, respond) -> None:
        try:
            response = await awaitable
        except asyncio.CancelledError:
            self._finish(rpc, cygrpc.StatusCode.cancelled, "cancelled")
            raise
        except Exception:
            log.exception("%s failed", rpc.method.handler.__name__)
            self._finish(rpc, cygrpc.StatusCode.unknown, "internal error")
            return
        respond(rpc, response)

    async def _stream(self, rpc: Rpc) -> None:
        await self._respond_later(rpc, rpc.method.handler(rpc), self._finish_ok)

    def _finish_ok(self, rpc: Rpc, _result) -> None:
        self._finish(rpc, _OK)

    def _cancel(self, rpc: Rpc) -> None:
        rpc.cancelled = True
        if rpc.task is not None and not rpc.task.done():
            rpc.task.cancel()
