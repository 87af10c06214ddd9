"""The official RocketMQ 5 Java and Go clients as commands for end-to-end tests.

`tests/clients/java` (org.apache.rocketmq:rocketmq-client-java 5.2.0, Maven) and `tests/clients/go`
(github.com/apache/rocketmq-clients/golang/v5 v5.1.4) are one small program each with the same
command line and output (their opening comments list it):

    send    --endpoint H:P --topic T [--count N] [--tag X] [--keys K1,K2] [--type NORMAL|FIFO|DELAY|
            PRIORITY|TRANSACTION] [--group MESSAGE_GROUP] [--priority P] [--delay-ms D] ...
    receive --endpoint H:P --topic T --group G [--count N] [--simple | --push] [--await-ms A] ...
    both:   [--tls default|on|off]  (default: the client's own default, which is TLS on)

and one JSON object a line on stdout per event ("client", "sent", "received", "checked", "done").

Each is built once per version of its sources into `${XDG_CACHE_HOME:-~/.cache}/tidemq/clients/
{java,go}-{hash of the sources}/`, outside the repository (Maven and Go download into their own
caches, ~/.m2 and the Go module cache).  A machine without Java and Maven, or without Go, fails the
tests that need them, saying what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[1] / "clients"
BUILD_TIMEOUT_S = 1800  # a first build downloads the client and its dependencies
RUN_TIMEOUT_S = 120  # a JVM on a busy machine takes long to start


def cache_directory() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidemq" / "clients"


class ClientUnavailable(Exception):
    """A tool a client needs is missing, or its build failed."""


def source_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Finished:
    """A client run that ended: its exit status, its JSON lines and its stderr."""

    command: list[str]
    returncode: int
    lines: list[dict]
    stderr: str

    def events(self, kind: str) -> list[dict]:
        return [line for line in self.lines if line.get("event") == kind]

    @property
    def tls(self) -> bool:
        (client,) = self.events("client")
        return client["tls"]

    def check(self) -> "Finished":
        if self.returncode != 0:
            raise AssertionError(f"{' '.join(self.command[-12:])} exited with {self.returncode}:\n"
                                 f"{json.dumps(self.lines)[-2000:]}\n{self.stderr[-4000:]}")
        return self


@dataclass
class Running:
    command: list[str]
    process: subprocess.Popen
    timeout: float
    _finished: Finished | None = field(default=None)

    def wait(self) -> Finished:
        """The run's end, within its timeout (then the client is killed and the test fails)."""
        if self._finished is None:
            try:
                out, err = self.process.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                out, err = self.process.communicate()
                raise AssertionError(f"{' '.join(self.command[-12:])} still running after {self.timeout} s:\n"
                                     f"{out[-2000:]}\n{err[-4000:]}") from None
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            self._finished = Finished(self.command, self.process.returncode, lines, err)
        return self._finished


class OfficialClient:
    """One built client; `start` runs it as a child process, `run` waits for it too."""

    def __init__(self, language: str, command: list[str], env: dict[str, str]) -> None:
        self.language = language
        self.command = command
        self.env = env

    def start(self, subcommand: str, endpoint: str, *args: str, timeout: float = RUN_TIMEOUT_S) -> Running:
        command = [*self.command, subcommand, "--endpoint", endpoint, *map(str, args)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=self.env)
        return Running(command, process, timeout)

    def run(self, subcommand: str, endpoint: str, *args: str, timeout: float = RUN_TIMEOUT_S) -> Finished:
        return self.start(subcommand, endpoint, *args, timeout=timeout).wait()


def _tool(name: str, needed_for: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ClientUnavailable(f"{name} is not on PATH: the {needed_for} client tests need it")
    return path


def _build_once(name: str, build) -> Path:
    """The directory holding `name`'s build for its current sources, built when missing.  A build
    goes to a directory of its own and is renamed into place whole, so that concurrent test runs
    never see half of one."""
    sources = SOURCES / name
    target = cache_directory() / f"{name}-{source_hash(sources)}"
    if (target / "ready").exists():
        return target
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        result = build(sources, building)
    except subprocess.TimeoutExpired as exc:
        raise ClientUnavailable(f"building the {name} client took over {exc.timeout} s") from None
    if result.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise ClientUnavailable(f"building the {name} client failed ({' '.join(result.args)}):\n"
                                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    (building / "ready").touch()
    try:
        building.rename(target)
    except OSError:  # another run put the same build in place first
        shutil.rmtree(building, ignore_errors=True)
    return target


def java_client(logs: Path) -> OfficialClient:
    """rocketmq-client-java 5.2.0, compiled with its dependencies' jars beside it."""
    java = _tool("java", "Java")
    maven = _tool("mvn", "Java")

    def build(sources: Path, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([maven, "-q", "-B", "-f", str(sources / "pom.xml"), f"-DclientBuildDir={out}", "compile"],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)

    built = _build_once("java", build)
    # a short-lived JVM: the quick JIT tier and the serial collector start it fastest
    command = [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m", f"-Drocketmq.log.root={logs}",
               "-cp", f"{built / 'classes'}{os.pathsep}{built / 'lib' / '*'}", "tidemq.testclient.Client"]
    return OfficialClient("java", command, dict(os.environ))


def go_client(logs: Path) -> OfficialClient:
    """github.com/apache/rocketmq-clients/golang/v5 v5.1.4, one binary."""
    go = _tool("go", "Go")

    def build(sources: Path, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([go, "build", "-mod=readonly", "-o", str(out / "client"), "."], cwd=sources,
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)

    built = _build_once("go", build)
    env = dict(os.environ)
    env["rocketmq.client.logRoot"] = str(logs)  # the client's own log file
    env.pop("rocketmq.client.enableSsl", None)  # its default, TLS on, unless a test says otherwise
    return OfficialClient("go", [str(built / "client")], env)
