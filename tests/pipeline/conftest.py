"""One real local Spark session for the whole pipeline test run, and a store to read."""

from __future__ import annotations

import pytest
from pipeline_logs import sample_messages, write_store

from tidemq.pipeline import spark_session


@pytest.fixture(scope="session")
def spark():
    session = spark_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def written_store(tmp_path_factory):
    """A store of several segments and the put results of its messages."""
    directory = tmp_path_factory.mktemp("store") / "broker-a"
    messages = sample_messages(1500)
    results = write_store(directory, messages)
    return directory, messages, results
