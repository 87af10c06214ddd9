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
    if package is None:
        package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return imported_by(ast.parse(path.read_text(), str(path)), package)


def imported_by(tree: ast.AST, package: str) -> set[str]:
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
            if name in ("mmap", "shutil") or name.startswith("tidemq.store.log") or name.startswith("tidemq.store.queues"):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert found == []


def test_the_checker_sees_a_violation(tmp_path):
    """The boundary test would fail on an offending import."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..broker import something\nimport asyncio\nfrom . import record\n")
    names = imported(probe, "tidemq.store")
    assert {"tidemq.broker", "tidemq.broker.something", "asyncio", "tidemq.store", "tidemq.store.record"} == names


# The store's folders (docs/store-layout.md), each with the store modules it may import besides
# its own folder, `errors` and the compiled helpers `_dispatch`: dependencies point down, from
# the codecs (`format`) through the structures (`log`, `queues`, `index`, `light`) to the stages that use
# them (`dispatch`, `recovery`).  `dispatch.requests` is the contract between dispatch and its
# sinks (`queues.queue_set`, `index.key_index`), so the structures may import it.
STORE_FOLDERS = {
    "format": (),
    "log": ("format",),
    "queues": ("format", "dispatch.requests"),
    "index": ("format", "log", "dispatch.requests"),
    "dispatch": ("format", "log", "queues", "index"),
    "recovery": ("format", "log", "queues", "light", "dispatch.requests"),
    "light": ("format", "log", "queues", "dispatch.requests"),
}
STORE_SHARED = ("errors", "blocks", "_dispatch")


def runtime_imports(path: Path) -> set[str]:
    """`imported`, without the imports under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return imported_by(tree, ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]))


def store_offenders() -> list[str]:
    found = []
    for path in modules("store"):
        parts = path.relative_to(PACKAGE / "store").parts
        if len(parts) == 1:
            continue  # the facade and MessageStore wire every part
        folder = parts[0]
        allowed = (folder, *STORE_FOLDERS[folder], *STORE_SHARED)
        for name in runtime_imports(path):
            if not name.startswith("tidemq.store."):
                continue
            inner = name[len("tidemq.store."):]
            if not any(inner == a or inner.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return found


def test_every_store_folder_is_known():
    folders = {p.name for p in (PACKAGE / "store").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(STORE_FOLDERS)


def test_store_folders_import_downwards():
    assert store_offenders() == []
