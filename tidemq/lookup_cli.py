"""`tidemq message show|query` and `tidemq dlq resend`: lookups and dead-letter resends on a
running broker, through its tidemq.Admin service (tidemq/broker/lookups.py)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from .broker_cli import DEFAULT_SERVER, _call, _print


def register(commands) -> None:
    message = commands.add_parser("message", help="find messages on a running broker")
    sub = message.add_subparsers(dest="message_command", required=True)
    p = sub.add_parser("show", help="a message by its client message id or its offset message id")
    p.add_argument("id", help="client message id (UNIQ_KEY) or offset message id (store host + commit-log offset)")
    p.add_argument("--topic", default=None, help="look in this topic only")
    _target(p)
    p.set_defaults(func=_message_show)
    p = sub.add_parser("query", help="messages of a topic by key or tag, newest first")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", default=None, help="a KEYS entry or client message id")
    p.add_argument("--tag", default=None, help="the message tag")
    p.add_argument("--begin", type=int, default=0, help="earliest store time, ms since the epoch")
    p.add_argument("--end", type=int, default=2**63 - 1, help="latest store time, ms since the epoch")
    p.add_argument("--max", type=int, default=64, help="at most this many messages (64)")
    _target(p)
    p.set_defaults(func=_message_query)

    dlq = commands.add_parser("dlq", help="dead letters of a consumer group")
    sub = dlq.add_subparsers(dest="dlq_command", required=True)
    p = sub.add_parser("resend", help="send the dead letters of %%DLQ%%GROUP back to their topics, once each")
    p.add_argument("--group", required=True)
    p.add_argument("--id", default=None, help="only this dead letter (offset message id or client message id)")
    _target(p)
    p.set_defaults(func=_dlq_resend)


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, help=f"a running broker's HOST:PORT (default {DEFAULT_SERVER})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(store=None)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _describe(m: dict) -> list[str]:
    body = f"{m['body_size']} bytes" + (", compressed" if m["compressed"] else "")
    lines = [
        f"message {m['message_id'] or '-'}  offset id {m['offset_msg_id']}",
        (
            f"  topic {m['topic']}  queue {m['queue_id']}  queue offset {m['queue_offset']}"
            f"  commit-log offset {m['commit_log_offset']}"
        ),
        f"  tags {m['tags'] or '-'}  keys [{' '.join(m['keys'])}]",
        (
            f"  stored {_time(m['store_timestamp'])} ({m['store_timestamp']}) on {m['store_host']}"
            f"  born {_time(m['born_timestamp'])} on {m['born_host']}  reconsumed {m['reconsume_times']}"
        ),
        "  properties " + json.dumps(m["properties"], sort_keys=True),
        f"  body {body}" + (": " + m["body_text"] if m["body_text"] is not None else " (not printable text)"),
    ]
    return lines


def _message_show(args) -> int:
    found = _call(args, "FindMessages", msg_id=args.id, topic=args.topic)
    return _print(args, found, [line for m in found for line in _describe(m)])


def _message_query(args) -> int:
    answer = _call(
        args,
        "QueryMessages",
        topic=args.topic,
        key=args.key,
        tag=args.tag,
        begin=args.begin,
        end=args.end,
        max_num=args.max,
    )
    found = answer["messages"]
    lines = [line for m in found for line in _describe(m)]
    lines.append(
        f"{len(found)} message(s)" + ("" if answer["complete"] else "; more may match (narrow with --begin/--end)")
    )
    _print(args, answer, lines)
    return 0 if found else 1


def _dlq_resend(args) -> int:
    answer = _call(args, "ResendDeadLetters", group=args.group, id=args.id)
    lines = [
        f"resent {r['offset_msg_id']} (message {r['message_id']}) to {r['topic']}/{r['queue_id']}"
        f" as {r['new_offset_msg_id']}"
        for r in answer["resent"]
    ]
    lines += [f"failed {f['offset_msg_id']}: {f['error']}" for f in answer["failed"]]
    lines.append(
        f"{answer['topic']}: {len(answer['resent'])} resent, {len(answer['already_resent'])} resent before,"
        f" {len(answer['failed'])} failed"
    )
    _print(args, answer, lines)
    return 1 if answer["failed"] else 0
