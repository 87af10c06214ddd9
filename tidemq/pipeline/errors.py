"""What went wrong in a pipeline job, said in one line, with Spark's own report kept beside it.

A failure inside a Spark task reaches the driver wrapped in Java and Python exceptions whose text
runs to hundreds of lines.  `job_errors()` turns it into `CorruptLogError` (a damaged log: the
offset and how to read around it) or `JobFailedError` (anything else: what failed and what to
do), chained to the original (`__cause__`), which the CLI prints under `-v`.  This module imports
nothing from Spark, so the broker and the CLI can import it freely.
"""

from __future__ import annotations

import contextlib
import re

PYTHON_HELP = (
    "choose an interpreter every worker has, with numpy and pyarrow, with "
    "--conf spark.pyspark.python=PATH (or PYSPARK_PYTHON)"
)


class CorruptLogError(RuntimeError):
    """An invalid record with valid records after it (the environment's fault: a damaged file)."""


class JobFailedError(RuntimeError):
    """A Spark job failed; the message is one line saying what failed and what to do."""


def _from_spark(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("py4j", "pyspark"))


def explain(text: str) -> RuntimeError:
    """The one-line error for the text of a Spark failure."""
    corrupt = re.search(r"CorruptLogError: (.*)", text)
    if corrupt:
        return CorruptLogError(corrupt.group(1).strip())
    program = re.search(r'Cannot run program "([^"]*)"', text)
    if program:
        return JobFailedError(f"Spark cannot start the Python {program.group(1)!r} for its workers: {PYTHON_HELP}")
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if missing:
        module = missing.group(1)
        if module.split(".")[0] == "tidemq":
            return JobFailedError(
                f"Spark's workers cannot import {module}: leave spark.tidemq.shipPackage on (it ships tidemq "
                "to them) or install tidemq in the workers' Python"
            )
        return JobFailedError(f"the workers' Python has no module {module!r}: install it there, or {PYTHON_HELP}")
    exists = re.search(r"\[PATH_ALREADY_EXISTS\] Path (\S+) already exists", text)
    if exists:
        return JobFailedError(f"{exists.group(1)} already exists: choose --mode overwrite or --mode append")
    # a Python exception raised in a task or in the source's planning: its last line says it
    raised = re.findall(r"^\s*((?:[A-Za-z_][\w.]*)?(?:Error|Exception)): (.+)$", text, re.MULTILINE)
    python_side = [(kind, message) for kind, message in raised if not kind.startswith(("java.", "org.", "py4j"))]
    if python_side:
        kind, message = python_side[-1]
        return JobFailedError(f"the Spark job failed: {kind}: {message.strip()}")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
    return JobFailedError(f"the Spark job failed: {first[:300]}")


@contextlib.contextmanager
def job_errors():
    """Run Spark actions; a failure from Spark becomes one `CorruptLogError` or `JobFailedError`
    chained to Spark's exception.  Errors raised by tidemq itself on the driver pass unchanged."""
    try:
        yield
    except (CorruptLogError, JobFailedError):
        raise
    except Exception as exc:
        if not _from_spark(exc):
            raise
        raise explain(str(exc)) from exc
