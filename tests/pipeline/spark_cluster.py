"""A real Spark standalone cluster on 127.0.0.1, started from the pyspark package's own classes,
and a worker Python that has the pipeline's runtime needs but not tidemq.

    with StandaloneCluster(tmp_dir, cores=2) as cluster:
        ... --master cluster.url --conf spark.pyspark.python=<worker_python()>

The master and the worker bind ephemeral ports (their logs say which) and are stopped by pid.
The worker Python is a virtualenv under the user's cache directory, built once (numpy, pyarrow
and zlib-ng at the driver's versions, from the pip cache when warm) and reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.]+:\d+)")
WORKER_REGISTERED = "Successfully registered with master"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidemq"


def worker_requirements() -> list[str]:
    """The data source's runtime needs, at the versions the driver runs."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("numpy", "pyarrow", "zlib-ng")]


def worker_python() -> str:
    """The interpreter of a virtualenv with the worker requirements and without tidemq."""
    requirements = worker_requirements()
    key = hashlib.sha256(" ".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    venv = cache_dir() / f"spark-worker-{key}"
    python = venv / "bin" / "python"
    done = venv / ".complete"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"spark-worker-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and reuse it
        if not done.exists():
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
            done.write_text(" ".join(requirements))
    return str(python)


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """A master and one worker (`cores` cores, `memory` for executors), as JVM child processes."""

    def __init__(self, directory: Path, cores: int = 2, memory: str = "2g", timeout: float = 300.0) -> None:
        self.directory = Path(directory)
        self.cores, self.memory, self.timeout = cores, memory, timeout
        self.processes: list[subprocess.Popen] = []
        self.url = ""

    def _start(self, name: str, *arguments: str) -> tuple[subprocess.Popen, Path]:
        log = self.directory / f"{name}.log"
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1")
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *arguments], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self.processes.append(process)
        return process, log

    def _wait_for(self, process: subprocess.Popen, log: Path, pattern: re.Pattern | str) -> re.Match | str:
        give_up = time.monotonic() + self.timeout
        while time.monotonic() < give_up:
            text = log.read_text(errors="replace")
            found = pattern.search(text) if isinstance(pattern, re.Pattern) else (pattern if pattern in text else None)
            if found:
                return found
            if process.poll() is not None:
                raise RuntimeError(f"{log.name} exited with {process.returncode}:\n{text[-4000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"{log.name}: no {pattern!r} after {self.timeout} s")

    def start(self) -> "StandaloneCluster":
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self.directory / "spark-daemons.conf"
        # no REST submission server: it would take the fixed port 6066
        properties.write_text("spark.master.rest.enabled false\nspark.worker.cleanup.enabled false\n")
        try:
            master, log = self._start(
                "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                "--webui-port", "0", "--properties-file", str(properties),
            )
            self.url = self._wait_for(master, log, MASTER_URL).group(1)
            worker, log = self._start(
                "worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--port", "0",
                "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.directory / "work"), "--properties-file", str(properties),
            )
            self._wait_for(worker, log, WORKER_REGISTERED)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the worker (which stops its executors), then the master; by pid, SIGKILL if slow."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
