"""TLS and plaintext HTTP/2 on one port, in front of the gRPC server's connections.

The listener accepts connections itself and reads each one's first byte without consuming it
(`MSG_PEEK`): 0x16 starts a TLS handshake record (a ClientHello), anything else is plaintext
HTTP/2 with prior knowledge (its preface starts "PRI ").  It then hands the socket to the event
loop's own transport, plain or TLS (ALPN "h2"), whose protocol is the HTTP/2 connection: once a
connection is handed over, every byte goes through the loop's native transport.  Apache RocketMQ's
proxy serves both on one port the same way.

Modes: `off` (plaintext only; a ClientHello is refused), `permissive` (both), `required` (TLS
only; plaintext is refused).  A refused connection is closed without an answer.

Bounds a peer cannot lift, the HTTP/2 server's own (`--preface-timeout-ms`, `--max-connections`):
a connection must send its first byte and finish its TLS handshake within `preface_timeout` of
being accepted, or it is closed; connections waiting for their first byte or in their handshake
count toward `max_connections` with those served (`served()`), and one accepted beyond it is
closed at once.  A protocol with an `opened_at` attribute (loop time: the HTTP/2 connection's, from
which its own preface timeout counts) has it set to the accept, so that the preface timeout bounds
the whole time from the accept to the HTTP/2 preface.  A failed handshake closes that connection
only.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

OFF, PERMISSIVE, REQUIRED = "off", "permissive", "required"
MODES = (OFF, PERMISSIVE, REQUIRED)
TLS_HANDSHAKE_RECORD = 0x16  # the content type of a TLS record carrying a handshake message
PREFACE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 4096
BACKLOG = 1024
MIN_HANDSHAKE_S = 0.01  # a handshake whose first byte came at the preface timeout's end gets this
ACCEPT_RETRY_DELAY_S = 1.0  # out of file descriptors: stop accepting this long
_OUT_OF_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for HTTP/2 over TLS (RFC 9113 §9.2): TLS 1.2 or later, ALPN "h2", no
    compression or renegotiation."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context


class SniffingListener:
    """Listens on one address and hands each accepted connection to `protocol_factory`'s
    protocol over a plain or TLS transport, by its first byte.  Call it as a coroutine
    `(protocol_factory, host, port)` (the shape of the loop's `create_server`); it returns itself,
    with `sockets` and `close()`."""

    def __init__(
        self,
        mode: str,
        context: ssl.SSLContext | None,
        preface_timeout: float = PREFACE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        served: Callable[[], int] = lambda: 0,
    ) -> None:
        """`served()`: how many connections the server behind holds (handed over, not yet closed)."""
        if mode not in MODES:
            raise ValueError(f"TLS mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode != OFF and context is None:
            raise ValueError(f"TLS mode {mode} needs a certificate")
        self.mode = mode
        self.context = context
        self.preface_timeout = preface_timeout
        self.max_connections = max_connections
        self.served = served
        self.sockets: list[socket.socket] = []
        # both set by the call that starts listening, before any socket is watched
        self.loop: asyncio.AbstractEventLoop
        self._protocol_factory: Callable[[], asyncio.Protocol]
        self._waiting: dict[socket.socket, asyncio.TimerHandle] = {}  # accepted, first byte not seen
        self._accepted_at: dict[socket.socket, float] = {}  # of those waiting: loop time of their accept
        self._handovers: set[asyncio.Task] = set()
        self._closed = False

    async def __call__(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> SniffingListener:
        self.loop = asyncio.get_running_loop()
        self._protocol_factory = protocol_factory
        addresses = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _, address in dict.fromkeys(addresses):
                if self.sockets and port == 0:  # every address of the host on the one port picked
                    address = (address[0], self.sockets[0].getsockname()[1], *address[2:])
                self._listen(socket.socket(family, kind, proto), address)
        except OSError:
            self.close()
            raise
        return self

    def _listen(self, listening: socket.socket, address) -> None:
        self.sockets.append(listening)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if listening.family == socket.AF_INET6:
            listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listening.bind(address)
        listening.listen(BACKLOG)
        listening.setblocking(False)
        self.loop.add_reader(listening.fileno(), self._accept, listening)

    def close(self) -> None:
        """Stop accepting; close the connections not yet handed over and end their handshakes.
        Connections already handed over belong to their protocol."""
        if self._closed:
            return
        self._closed = True
        for listening in self.sockets:
            if listening.fileno() >= 0:
                self.loop.remove_reader(listening.fileno())
                listening.close()
        for connection in list(self._waiting):
            self._forget(connection)
            connection.close()
        for task in self._handovers:
            task.cancel()

    # -- accepting --

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(BACKLOG):
            try:
                connection, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    continue  # that connection was aborted before it was accepted
                log.error(
                    "cannot accept connections on %s (%s): retrying in %.0f s",
                    listening.getsockname(),
                    exc.strerror,
                    ACCEPT_RETRY_DELAY_S,
                )
                self.loop.remove_reader(listening.fileno())
                self.loop.call_later(ACCEPT_RETRY_DELAY_S, self._resume_accepting, listening)
                return
            sniffed = len(self._waiting) + len(self._handovers)
            if sniffed + self.served() >= self.max_connections:
                log.warning(
                    "closing a connection from %s: %d connections are open, %d of them waiting for their "
                    "first byte or handshake",
                    _peer(connection),
                    sniffed + self.served(),
                    sniffed,
                )
                connection.close()
                continue
            connection.setblocking(False)
            self._accepted_at[connection] = self.loop.time()
            self._waiting[connection] = self.loop.call_later(self.preface_timeout, self._silent, connection)
            self.loop.add_reader(connection.fileno(), self._first_byte, connection)

    def _resume_accepting(self, listening: socket.socket) -> None:
        if not self._closed:
            self.loop.add_reader(listening.fileno(), self._accept, listening)

    def _forget(self, connection: socket.socket) -> float:
        """Stop waiting for `connection`'s first byte; returns the loop time it was accepted."""
        self._waiting.pop(connection).cancel()
        self.loop.remove_reader(connection.fileno())
        return self._accepted_at.pop(connection)

    def _silent(self, connection: socket.socket) -> None:
        log.info("closing a connection from %s: nothing received in %g s", _peer(connection), self.preface_timeout)
        self._forget(connection)
        connection.close()

    def _first_byte(self, connection: socket.socket) -> None:
        try:
            head = connection.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            head = b""
        accepted_at = self._forget(connection)
        if not head:
            connection.close()  # closed or reset before saying anything
            return
        tls = head[0] == TLS_HANDSHAKE_RECORD
        if tls and self.mode == OFF:
            log.info("refusing a TLS connection from %s: TLS is off", _peer(connection))
            connection.close()
            return
        if not tls and self.mode == REQUIRED:
            log.info("refusing a plaintext connection from %s: TLS is required", _peer(connection))
            connection.close()
            return
        task = self.loop.create_task(self._hand_over(connection, tls, accepted_at))
        self._handovers.add(task)

    async def _hand_over(self, connection: socket.socket, tls: bool, accepted_at: float) -> None:
        peer = _peer(connection)
        factory = self._protocol_factory
        assert factory is not None  # set when listening began

        def protocol() -> asyncio.Protocol:
            made = factory()
            if hasattr(made, "opened_at"):
                made.opened_at = accepted_at
            return made

        try:
            if tls:
                left = accepted_at + self.preface_timeout - self.loop.time()  # the handshake gets what is left
                await self.loop.connect_accepted_socket(
                    protocol, connection, ssl=self.context, ssl_handshake_timeout=max(left, MIN_HANDSHAKE_S)
                )
            else:
                await self.loop.connect_accepted_socket(protocol, connection)
        except (TimeoutError, OSError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            log.info(
                "closing a %s connection from %s: %s", "TLS" if tls else "plaintext", peer, exc or type(exc).__name__
            )
            connection.close()
        finally:
            # Uncounted in the loop turn that follows the socket's close, before that turn's accepts:
            # a peer that connects again on seeing the close finds the slot free (a done callback
            # would run a turn later, after such an accept).
            self._handovers.discard(asyncio.current_task())


def _peer(connection: socket.socket) -> str:
    try:
        host, port = connection.getpeername()[:2]
    except OSError:
        return "a gone peer"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
