"""One RocketMQ 5.5.0 name server for the session; brokers come and go on the modules' store
directories."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rocketmq_cluster import RocketMQ  # noqa: E402


@pytest.fixture(scope="session")
def rocketmq(tmp_path_factory):
    cluster = RocketMQ(tmp_path_factory.mktemp("rocketmq"))
    yield cluster
    cluster.close()
