"""The layers of DESIGN.md, kept honest: who may import whom, and who may touch files."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tidemq"


def modules(layer: str) -> list[Path]:
    root = PACKAGE / layer
    return sorted(root.rglob("*.py")) if root.is_dir() else []


def imported(path: Path, package: str | None = None) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved against the
    file's package)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def offenders(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in modules(layer):
        for name in imported(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return found


def test_every_layer_exists():
    for layer in ("store", "broker", "protocol", "pipeline"):
        assert modules(layer), f"tidemq/{layer} has no modules"


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        # the store imports nothing above it: no network, no asyncio, no protobuf
        ("store", ("tidemq.broker", "tidemq.protocol", "tidemq.pipeline", "tidemq.server", "tidemq.cli", "asyncio", "grpc", "google.protobuf", "rocketmq")),
        # the broker never imports the protocols or the pipeline, and speaks no protobuf
        ("broker", ("tidemq.protocol", "tidemq.pipeline", "tidemq.server", "tidemq.cli", "grpc", "google.protobuf", "rocketmq")),
        # the pipeline uses the store's codecs, never the broker
        ("pipeline", ("tidemq.broker", "tidemq.protocol", "tidemq.server")),
        # protocol adapters go through the broker
        ("protocol", ("tidemq.pipeline", "tidemq.server", "tidemq.cli")),
    ],
)
def test_import_boundaries(layer, forbidden):
    assert offenders(layer, forbidden) == []


def test_protocols_never_touch_files():
    found = []
    for path in modules("protocol"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} calls open()")
        for name in imported(path):
            if name in ("mmap", "shutil") or name.startswith("tidemq.store.commit_log") or name.startswith("tidemq.store.consume_queue"):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert found == []


def test_the_checker_sees_a_violation(tmp_path):
    """The boundary test would fail on an offending import."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..broker import something\nimport asyncio\nfrom . import record\n")
    names = imported(probe, "tidemq.store")
    assert {"tidemq.broker", "tidemq.broker.something", "asyncio", "tidemq.store", "tidemq.store.record"} == names
