"""The `tidemq` command at its edges: a missing or mistyped store, --version, serve's defaults in
its help, -v after the subcommand, a port already in use.  Each answers one clear line and the
right exit status, and creates nothing where the user mistyped."""

import socket
import subprocess
import sys

import pytest

from tidemq.cli import main


def run(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (print(exit.code, file=sys.stderr) or 1)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [("store", "inspect"), ("store", "check"), ("store", "repair"),
                                  ("topic", "list", "--store"), ("group", "list", "--store")])
def test_a_missing_store_is_one_line_and_nothing_is_created(tmp_path, capsys, args):
    code, out, err = run(capsys, *args, str(tmp_path / "TYPO"))
    assert code != 0 and not out
    assert err.strip() == f"tidemq: no store at {tmp_path / 'TYPO'}: no such directory"
    assert not (tmp_path / "TYPO").exists()


def test_version_help_defaults_and_verbose_after_the_subcommand(tmp_path, capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("tidemq ")
    code, out, _ = run(capsys, "serve", "--help")
    text = " ".join(out.split())
    assert code == 0 and "(default async)" in text and "(default 8)" in text and "(default 1073741824)" in text
    code, _, err = run(capsys, "store", "check", str(tmp_path / "NOSUCHDIR"), "-v")
    assert code != 0 and "no store at" in err  # not "unrecognized arguments: -v"


def test_a_port_in_use_is_one_line_and_leaves_no_abort_marker(tmp_path):
    store = tmp_path / "store"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "tidemq.cli", "serve", "--store", str(store), "--listen",
                              f"127.0.0.1:{port}", "--segment-size", str(1 << 20)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("tidemq: ") and "address already in use" in out.stderr.lower()
    assert (store / "commitlog").is_dir() and not (store / "abort").exists()  # closed cleanly
