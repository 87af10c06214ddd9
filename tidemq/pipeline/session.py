"""The Spark session the pipeline runs in: Java check, the executors' Python, tidemq shipped to
them, data source registration.

Local mode (`local[*]`) is the default; any master URL works.  Spark settings pass through as a
dict (`--conf k=v` on the command line), and the caller's settings win over the defaults here.

The executors' interpreter is, in order: the `spark.pyspark.python` setting, `PYSPARK_PYTHON`,
and for a local master this very interpreter (for a cluster master Spark's own default,
`python3` on the executors' PATH).  It needs NumPy and PyArrow (the data source's runtime needs),
not tidemq: for a cluster master the session ships tidemq's pure-Python package to the executors
as a zip in `spark.submit.pyFiles` (the compiled parts stay behind; the store's codecs fall back
to Python and NumPy without them).  `spark.tidemq.shipPackage=false` turns that off for a cluster
whose executors have tidemq installed."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

JAVA_HELP = (
    "the Spark pipeline needs a Java runtime (17 or newer) and found none: install one "
    "(e.g. `apt-get install openjdk-17-jre-headless`, `brew install openjdk@17`) and put `java` "
    "on PATH or set JAVA_HOME to its directory"
)
SHIP_PACKAGE = "spark.tidemq.shipPackage"


class JavaNotFoundError(RuntimeError):
    """No Java runtime for Spark (the environment's fault)."""


def find_java() -> str:
    """The java executable Spark will start: JAVA_HOME's if set, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise JavaNotFoundError(f"JAVA_HOME is {home!r}, which holds no bin/java; {JAVA_HELP}")
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(JAVA_HELP)
    return found


def is_local(master: str) -> bool:
    """`local`, `local[N]`, `local[*]`, `local[N,F]`: executors inside the driver's JVM, running
    this machine's Python.  (`local-cluster[...]` starts executor JVMs like a cluster does.)"""
    return master == "local" or master.startswith("local[")


_set_here: str | None = None  # the PYSPARK_PYTHON this module set, told apart from the user's


def executor_python(master: str, conf: Mapping[str, str]) -> str | None:
    """The interpreter executors run, by Spark's precedence; None leaves Spark's default."""
    from_env = os.environ.get("PYSPARK_PYTHON")
    chosen = conf.get("spark.pyspark.python") or (from_env if from_env != _set_here else None)
    if chosen:
        return chosen
    return sys.executable if is_local(master) else None


def package_sources() -> list[tuple[str, Path]]:
    """(name in the zip, file) of every Python source of the tidemq package, sorted."""
    root = Path(__file__).resolve().parent.parent
    files = [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted((str(Path("tidemq") / p.relative_to(root)), p) for p in files)


_shipped: dict[str, str] = {}


def package_zip() -> str:
    """A zip of tidemq's pure-Python package, written once per process (its name holds a digest
    of the sources, so Spark never confuses two versions) and removed at exit."""
    sources = package_sources()
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    key = digest.hexdigest()[:16]
    if key not in _shipped:
        directory = tempfile.mkdtemp(prefix="tidemq-pyfiles-")
        atexit.register(shutil.rmtree, directory, True)
        target = Path(directory) / f"tidemq-{key}.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in sources:
                archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), path.read_bytes())
        _shipped[key] = str(target)
    return _shipped[key]


def session_conf(master: str, conf: Mapping[str, str] | None) -> dict[str, str]:
    """The settings a session starts with: the pipeline's defaults under the caller's."""
    settings = {"spark.sql.session.timeZone": "UTC"}
    if is_local(master):
        # everything runs on this machine: keep the driver and its block manager on loopback
        # (Spark would otherwise pick the first non-loopback interface); a cluster master uses
        # whatever addresses the caller configures
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    ship = str(settings.pop(SHIP_PACKAGE, "true")).lower() != "false"
    if ship and not is_local(master):
        py_files = [f for f in settings.get("spark.submit.pyFiles", "").split(",") if f]
        settings["spark.submit.pyFiles"] = ",".join([*py_files, package_zip()])
    return settings


def spark_session(master: str = "local[*]", conf: Mapping[str, str] | None = None, app_name: str = "tidemq-pipeline"):
    """Get or create the SparkSession, with the tidemq-commitlog data source registered."""
    find_java()
    conf = dict(conf or {})
    global _set_here
    python = executor_python(master, conf)
    # pyspark reads the executors' interpreter from PYSPARK_PYTHON when the context starts
    if python:
        os.environ["PYSPARK_PYTHON"] = _set_here = python
    elif os.environ.get("PYSPARK_PYTHON") == _set_here:
        os.environ.pop("PYSPARK_PYTHON", None)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_conf(master, conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    shipped = [f for f in spark.sparkContext.getConf().get("spark.submit.pyFiles", "").split(",") if f]
    if shipped and not is_local(master) and Path(shipped[-1]).name.startswith("tidemq-"):
        ensure_shipped(spark.sparkContext, shipped[-1])
    register(spark)
    return spark


def ensure_shipped(context, path: str) -> None:
    """Make the executors fetch the zip at `path`.  Only the first context of a JVM distributes
    `spark.submit.pyFiles` (spark-submit does, when it starts the JVM): a later one, started after
    `stop()`, adds it as a file here.  Data sources registered afterwards carry it among their
    Python includes."""
    name = Path(path).name
    if not any(Path(added).name == name for added in context.listFiles):
        context.addPyFile(path)


def register(spark) -> None:
    """Register the `tidemq-commitlog` data source with a session."""
    from .source import CommitLogDataSource

    spark.dataSource.register(CommitLogDataSource)


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """`k=v` strings (the CLI's repeated --conf) as a dict; a pair without '=' is the caller's error."""
    conf: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf expects key=value, got {pair!r}")
        conf[key.strip()] = value
    return conf
