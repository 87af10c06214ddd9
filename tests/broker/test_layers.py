"""The broker's and protocol adapter's side of DESIGN.md's import rules: the broker never imports
protobuf, grpc or the protocol/pipeline packages; protocol adapters never open files."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tidemq"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = "." * node.level
            names.add(prefix + (node.module or ""))
    return names


def test_broker_imports_no_protocol_pipeline_protobuf_or_grpc():
    for path in (PACKAGE / "broker").glob("*.py"):
        for name in imports_of(path):
            assert not name.startswith(("..protocol", "..pipeline", "tidemq.protocol", "tidemq.pipeline",
                                        "grpc", "google.protobuf", "rocketmq")), f"{path.name} imports {name}"


def test_protocol_adapters_do_not_touch_files():
    for path in (PACKAGE / "protocol").rglob("*.py"):
        text = path.read_text()
        for call in ("open(", "Path(", "os.open", "os.write", "..store.MessageStore"):
            assert call not in text, f"{path.relative_to(PACKAGE)} uses {call}"
        for name in imports_of(path):
            assert name not in ("pathlib", "shutil", "tempfile"), f"{path.name} imports {name}"
