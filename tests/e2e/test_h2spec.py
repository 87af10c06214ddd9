"""h2spec 2.2.1, the HTTP/2 conformance suite (generic, http2 and hpack sections), against a real
`tidemq serve`.  It is installed with `go install` into the cache outside the repository; without
Go the test fails and says so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .server import ServerProcess

H2SPEC_MODULE = "github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible"  # v2.2.1 has no go.mod of /v2


def h2spec_binary() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidemq"
    binary = cache / "bin" / "h2spec-2.2.1"
    if binary.exists():
        return binary
    go = shutil.which("go")
    assert go, "Go is not installed: h2spec (the HTTP/2 conformance suite) is installed with `go install`"
    build = cache / "h2spec-build"
    build.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([go, "install", H2SPEC_MODULE], env={**os.environ, "GOBIN": str(build)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"go install {H2SPEC_MODULE} failed:\n{done.stderr}"
    (build / "h2spec").replace(binary)
    return binary


def test_h2spec_passes_whole(tmp_path):
    binary = h2spec_binary()
    server = ServerProcess(tmp_path / "store").start()
    try:
        run = subprocess.run([str(binary), "-h", "127.0.0.1", "-p", str(server.port), "-o", "3"],
                             capture_output=True, text=True, timeout=600)
    finally:
        assert server.stop() == 0, server.log_text()
    output = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    summary = re.search(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", output)
    assert summary, output
    total, passed, skipped, failed = map(int, summary.groups())
    assert (failed, skipped, passed) == (0, 0, total), output[output.find("Failures:"):]
    assert total >= 145
    assert "Traceback" not in server.log_text()
