"""A tidemq server in a child process, as a user runs it, and helpers for SDK clients."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials

READY = re.compile(r"tidemq ready: gRPC on ([\d.]+):(\d+)")

# Tests' stores are small: 64 MiB commit-log segments instead of the 1 GiB default (each segment
# is preallocated on disk), unless a test chooses the size or passes a config file.
TEST_SEGMENT_SIZE = str(64 << 20)


class ServerProcess:
    def __init__(self, store: Path, *args: str, wrapper: tuple[str, ...] = ()) -> None:
        """`wrapper`: a command the server runs under (it must exec the server in its own process)."""
        self.store = Path(store)
        self.wrapper = wrapper
        if not any(a in ("--segment-size", "--config") or a.startswith("--segment-size=") for a in args):
            args = ("--segment-size", TEST_SEGMENT_SIZE, *args)
        self.args = args
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log_path = self.store.parent / f"{self.store.name}.server.log"

    def start(self, timeout: float = 30.0, same_port: bool = False) -> "ServerProcess":
        """Start on an ephemeral port, or (restart) on the port it had before."""
        listen = f"127.0.0.1:{self.port if same_port else 0}"
        log = open(self.log_path, "ab")
        offset = log.tell()
        self.process = subprocess.Popen(
            [*self.wrapper, sys.executable, "-m", "tidemq.cli", "serve", "--store", str(self.store), "--listen", listen, *self.args],
            stdout=log, stderr=log, cwd=self.store.parent,
        )
        log.close()
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            match = READY.search(text)
            if match:
                self.port = int(match.group(2))
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{text}")
            time.sleep(0.02)
        raise TimeoutError(f"server not ready after {timeout} s")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self) -> ClientConfiguration:
        return ClientConfiguration(self.address, Credentials(), request_timeout=3)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self.process = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running(store: Path, *args: str):
    """A server for the `with` block; it must stop cleanly."""
    server = ServerProcess(store, *args).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log_text()


def tidemq(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidemq.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def wait_until(condition, timeout: float = 20.0, what: str = "condition"):
    """Poll `condition` until it returns something truthy (not a timing assertion: a bound on
    how long a test may hang)."""
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# a frame's type (SETTINGS) and flags, after its 3-byte length
_SETTINGS_FRAME_HEADER = b"\x04\x00"
_CLIENT_PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def speaks_http2(s: socket.socket) -> bool:
    """Sends the HTTP/2 client preface on a fresh connection (plain or TLS); true when the server's
    SETTINGS frame comes back."""
    s.sendall(_CLIENT_PREFACE_AND_SETTINGS)
    head = b""
    while len(head) < 5:
        chunk = s.recv(5 - len(head))
        if not chunk:
            return False
        head += chunk
    return head[3:5] == _SETTINGS_FRAME_HEADER


def closed_by_server(s: socket.socket) -> bool:
    """True when the server ends the connection (within the socket's timeout) without a byte."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
