import logging

import pytest

logging.getLogger("tidemq").setLevel(logging.DEBUG)


@pytest.fixture(scope="session")
def spark():
    """One real local Spark session for the whole test run (pipeline and compatibility tests)."""
    from tidemq.pipeline import spark_session

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
