"""Comparing directory trees byte for byte (rebuilt indexes against the originals)."""

import filecmp
from pathlib import Path


def same_tree(a: Path, b: Path) -> list[str]:
    """Relative paths that differ (missing on one side or different bytes)."""
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    differ = sorted(str(p) for p in files_a ^ files_b)
    differ += sorted(str(p) for p in files_a & files_b if not filecmp.cmp(a / p, b / p, shallow=False))
    return differ
