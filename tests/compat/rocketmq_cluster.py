"""The real Apache RocketMQ 5.5.0 beside tidemq: its jars resolved with Maven into a cache outside
the repository, its name server and broker run on loopback, and `CompatTool` (this folder's small
Java program on the 4.x-style client) to write and read through them.

    ${XDG_CACHE_HOME:-~/.cache}/tidemq/rocketmq/
        m2/              Maven's local repository for these artifacts
        build/HASH/      CompatTool's jar, per version of its sources and the pom
        lib/HASH/        every dependency jar, per version of the pom
        home/conf/       ROCKETMQ_HOME (empty: the logback configurations are in the jars)

Java 17 and Maven must be on PATH (or JAVA_HOME); without them the tests fail saying so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
VERSION = "5.5.0"
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
TOOL_MAIN = "tidemq.compat.CompatTool"
START_TIMEOUT_S = 300  # JVM start-up on a loaded machine


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tidemq" / "rocketmq"


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    found = str(candidate) if candidate and candidate.exists() else shutil.which("java")
    if not found:
        pytest.fail("the RocketMQ compatibility tests need Java 17+: no `java` on PATH or in JAVA_HOME")
    return found


def build_classpath() -> str:
    """Resolve RocketMQ 5.5.0 and build CompatTool: one jar per version of the program, one
    lib/ of dependency jars per version of the pom, so that checkouts at different versions
    share the cache without replacing each other's jar under a running test."""
    java_executable()
    mvn = shutil.which("mvn")
    if not mvn:
        pytest.fail("the RocketMQ compatibility tests need Maven (`mvn` on PATH) to resolve RocketMQ 5.5.0")
    cache = cache_dir()
    pom = HERE / "pom.xml"
    sources = [pom, *sorted((HERE / "src").rglob("*.java"))]
    build = cache / "build" / hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    lib = cache / "lib" / hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    jar = build / "tidemq-compat-1.jar"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the next finds it done
        goals = [] if jar.exists() else ["package"]
        goals += [] if (lib / "complete").exists() else ["dependency:copy-dependencies"]
        if goals:
            command = [
                mvn, "-B", "-q", "-f", str(pom), f"-Dmaven.repo.local={cache / 'm2'}", f"-Dcompat.build={build}",
                f"-Dcompat.lib={lib}", *goals,
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0 or not jar.exists():
                pytest.fail(f"Maven could not build the RocketMQ side ({' '.join(command)}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
            (lib / "complete").touch()
    return os.pathsep.join([str(jar), str(lib / "*")])


def free_port(neighbours: tuple[int, ...] = (0,)) -> int:
    """A loopback port p such that p + d is free for every d in `neighbours`."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if all(_free(port + d) for d in neighbours if d):
            return port
    raise RuntimeError("no free loopback ports")


def _free(port: int) -> bool:
    if not 1024 < port < 65535:
        return False
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class JavaProcess:
    def __init__(self, name: str, main: str, args: list[str], classpath: str, workdir: Path, heap: str) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.out"
        home = cache_dir() / "home"
        (home / "conf").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, ROCKETMQ_HOME=str(home))
        command = [
            java_executable(), f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", f"-Duser.home={workdir}",
            "-Drocketmq.client.logUseSlf4j=false", "-cp", classpath, main, *args,
        ]
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir, env=env)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_text(self, text: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{self.name} did not print {text!r}:\n{self.output()[-4000:]}")

    def stop(self) -> int:
        """SIGTERM (RocketMQ's shutdown hooks flush and close the store) and wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


class RocketMQ:
    """A name server, and brokers started one at a time on given store directories."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.classpath = build_classpath()
        self.namesrv_port = free_port()
        self.namesrv_addr = f"127.0.0.1:{self.namesrv_port}"
        conf = workdir / "namesrv.conf"
        conf.write_text(f"listenPort={self.namesrv_port}\nbindAddress=127.0.0.1\n")
        self.namesrv = JavaProcess("namesrv", NAMESRV_MAIN, ["-c", str(conf)], self.classpath, workdir, "256m")
        self.namesrv.wait_for_text("boot success")
        self.broker: JavaProcess | None = None
        self.broker_addr = ""
        self.brokers_started = 0

    def start_broker(self, store: Path, *settings: str) -> None:
        """A broker on `store`; `settings` are more `key=value` lines of its configuration."""
        assert self.broker is None
        port = free_port((-2, 1))  # listen, fast (listen - 2) and HA (listen + 1) ports
        self.brokers_started += 1
        conf = self.workdir / f"broker{self.brokers_started}.conf"
        conf.write_text("\n".join([
            "brokerClusterName=CompatCluster", "brokerName=broker-a", "brokerId=0", "brokerRole=ASYNC_MASTER",
            "flushDiskType=ASYNC_FLUSH", f"namesrvAddr={self.namesrv_addr}", "brokerIP1=127.0.0.1",
            "bindAddress=127.0.0.1", f"listenPort={port}", f"haListenPort={port + 1}", f"storePathRootDir={store}",
            f"storePathCommitLog={store / 'commitlog'}", "autoCreateTopicEnable=true",
            "autoCreateSubscriptionGroup=true", "enableLmq=true", "enableMultiDispatch=true",
            "fileReservedTime=87600", *settings, "",
        ]))
        self.broker = JavaProcess(f"broker{self.brokers_started}", BROKER_MAIN, ["-c", str(conf)], self.classpath,
                                  self.workdir, "1g")
        self.broker.wait_for_text("boot success")
        self.broker_addr = f"127.0.0.1:{port}"

    def stop_broker(self) -> None:
        broker, self.broker = self.broker, None
        if broker is not None:
            code = broker.stop()
            assert code in (0, 143), f"broker exited with {code}:\n{broker.output()[-4000:]}"

    def tool(self, *args: str, timeout: float = 300) -> list[dict]:
        """Run CompatTool; its JSON lines."""
        command = [java_executable(), "-Xmx256m", f"-Duser.home={self.workdir}", "-cp", self.classpath, TOOL_MAIN, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.workdir)
        assert done.returncode == 0, f"CompatTool {args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def close(self) -> None:
        self.stop_broker()
        self.namesrv.stop()
