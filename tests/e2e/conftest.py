import asyncio

import pytest

from . import clients
from .server import ServerProcess

FLUSH_MODES = ("async", "sync")


def pytest_generate_tests(metafunc):
    """Tests that use the module's `server` run once per flush mode (a module may name fewer in
    its own FLUSH_MODES: those whose subject does not depend on the flush policy)."""
    if "server" in metafunc.fixturenames:
        modes = getattr(metafunc.module, "FLUSH_MODES", FLUSH_MODES)
        metafunc.parametrize("server", modes, indirect=True, scope="module", ids=[f"{m}-flush" for m in modes])


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """One broker per test module and flush mode (otherwise defaults)."""
    flush = request.param
    s = ServerProcess(tmp_path_factory.mktemp(f"broker-{flush}") / "store", "--flush", flush).start()
    yield s
    assert s.stop() == 0, s.log_text()


@pytest.fixture(autouse=True)
def main_thread_event_loop_as_in_a_fresh_process():
    """The official SDK sometimes makes a gRPC call object on the calling thread, which asks
    asyncio for that thread's event loop.  In a fresh process the main thread gets one made on
    demand; after an `asyncio.run` in an earlier test (tests/broker) it has none and may not
    make one, and the SDK's telemetry stream fails to start ("There is no current event loop in
    thread 'MainThread'"; about 1 suite run in 8).  Each end-to-end test starts as a fresh
    process would."""
    asyncio.set_event_loop_policy(None)


def _official_client(build, tmp_path_factory, name: str):
    try:
        return build(tmp_path_factory.mktemp(f"{name}-client-logs"))
    except clients.ClientUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def java_client(tmp_path_factory) -> clients.OfficialClient:
    """The official Java client 5.2.0 as a command (tests/e2e/clients.py), built once."""
    return _official_client(clients.java_client, tmp_path_factory, "java")


@pytest.fixture(scope="session")
def go_client(tmp_path_factory) -> clients.OfficialClient:
    """The official Go client v5.1.4 as a command (tests/e2e/clients.py), built once."""
    return _official_client(clients.go_client, tmp_path_factory, "go")
