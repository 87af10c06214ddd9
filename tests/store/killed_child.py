"""A child process that appends and prints a line per acknowledged put, killed with SIGKILL
once enough acknowledgements are in (the crash tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def run_and_kill(
    code: str, args: list[str], acks_before_kill: int, parse: Callable[[str], tuple | None], errors: Path
) -> dict:
    """Run `python -c code *args`; after its "ready" line, collect `parse(line)` -> (key, value)
    of each acknowledgement line until `acks_before_kill` are in, then SIGKILL it.  Lines already
    in the pipe were acknowledged before the kill as well: they are collected too (`parse` gives
    None for a line that is not a whole acknowledgement).  The child's stderr goes to `errors`."""
    with open(errors, "w") as err:
        child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=err, text=True)
    acked: dict = {}
    try:
        first = child.stdout.readline().strip()
        while len(acked) < acks_before_kill and first == "ready":
            line = child.stdout.readline()
            if not line:
                break
            found = parse(line)
            if found is not None:
                acked[found[0]] = found[1]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert first == "ready" and len(acked) >= acks_before_kill, errors.read_text()
    for line in child.stdout.read().splitlines():
        found = parse(line)
        if found is not None:
            acked[found[0]] = found[1]
    child.stdout.close()
    return acked
