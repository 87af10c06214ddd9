"""The Spark session the pipeline runs in: Java check, worker interpreter, data source registration.

Local mode (`local[*]`) is the default; any master URL works.  Spark settings pass through as a
dict (`--conf k=v` on the command line)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Mapping

JAVA_HELP = (
    "the Spark pipeline needs a Java runtime (17 or newer) and found none: install one "
    "(e.g. `apt-get install openjdk-17-jre-headless`, `brew install openjdk@17`) and put `java` "
    "on PATH or set JAVA_HOME to its directory"
)


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


def spark_session(master: str = "local[*]", conf: Mapping[str, str] | None = None, app_name: str = "tidemq-pipeline"):
    """Get or create the SparkSession, with the tidemq-commitlog data source registered.

    Workers run this very interpreter (`PYSPARK_PYTHON = sys.executable`), so they import the
    same tidemq and pyarrow the driver has."""
    find_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if master.startswith("local"):
        # everything runs on this machine: keep the driver and its block manager on loopback
        # (Spark would otherwise pick the first non-loopback interface); a cluster master uses
        # whatever addresses the caller configures
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


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
