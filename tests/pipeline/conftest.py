"""A store for the pipeline tests to read (the Spark session: tests/conftest.py)."""

from __future__ import annotations

import pytest
from pipeline_logs import sample_messages, write_store


@pytest.fixture(scope="session")
def written_store(tmp_path_factory):
    """A store of several segments and the put results of its messages."""
    directory = tmp_path_factory.mktemp("store") / "broker-a"
    messages = sample_messages(1500)
    results = write_store(directory, messages)
    return directory, messages, results
