import pytest

from .server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One broker per test module (async flush, defaults)."""
    s = ServerProcess(tmp_path_factory.mktemp("broker") / "store").start()
    yield s
    assert s.stop() == 0, s.log_text()
