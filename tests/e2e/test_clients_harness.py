"""The harness that builds and runs the official Java and Go clients (tests/e2e/clients.py)."""

from __future__ import annotations

import pytest

from . import clients


@pytest.mark.parametrize("build, tool", [(clients.java_client, "java"), (clients.go_client, "go")])
def test_a_missing_tool_fails_saying_which(tmp_path, monkeypatch, build, tool):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(clients.ClientUnavailable, match=f"{tool} is not on PATH"):
        build(tmp_path)


def test_a_build_is_kept_per_version_of_the_sources(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "Main.java").write_text("class Main {}")
    (tmp_path / "pom.xml").write_text("<project/>")
    first = clients.source_hash(tmp_path)
    assert clients.source_hash(tmp_path) == first
    (tmp_path / "src" / "Main.java").write_text("class Main { }")
    assert clients.source_hash(tmp_path) != first
    (tmp_path / "src" / "Main.java").write_text("class Main {}")
    (tmp_path / "src" / "Other.java").write_text("")
    assert clients.source_hash(tmp_path) != first


def test_the_cache_is_outside_the_repository(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert clients.cache_directory() == tmp_path / "tidemq" / "clients"
    assert not clients.cache_directory().is_relative_to(clients.SOURCES.parents[1])
