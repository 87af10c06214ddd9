"""The README's SDK snippets, run as written against a test server (only the address changes)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tidemq.protocol.grpc import admin_call

README = Path(__file__).resolve().parents[2] / "README.md"
FLUSH_MODES = ("async",)  # the snippets do not depend on the flush policy


def broker_snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## The broker: RocketMQ 5 gRPC endpoint"):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_producer_and_consumer_snippets_work(server):
    producer, consumer, transactional = broker_snippets()[:3]
    admin_call(server.address, "CreateTopic", name="payments", queue_nums=8, message_type="TRANSACTION")
    outputs = []
    for code in (producer, consumer, transactional):
        assert "127.0.0.1:8081" in code
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace("127.0.0.1:8081", server.address), str(README), "exec"), {})
        outputs.append(out.getvalue())
    assert outputs[0].startswith("sent ")
    assert "received paid order 42 paid attempt 1" in outputs[1]
    assert outputs[2].startswith("committed ")


def test_readme_delay_and_sql_snippets_work(server):
    from tidemq.protocol.grpc import admin_call

    delay, sql = broker_snippets()[3:5]
    admin_call(server.address, "CreateTopic", name="reminders", queue_nums=2, message_type="DELAY")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(delay.replace("127.0.0.1:8081", server.address), str(README), "exec"), {})
    assert out.getvalue().startswith("recalled ")
    exec(compile(sql, str(README), "exec"), {})
