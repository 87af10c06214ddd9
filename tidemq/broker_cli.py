"""`tidemq serve`, `tidemq topic ...` and `tidemq group ...`.

Admin commands reach a running broker with `--server HOST:PORT` (its tidemq.Admin service) or,
with `--store DIR`, a stopped broker's store directly."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

DEFAULT_SERVER = "127.0.0.1:8081"


def register(commands) -> None:
    from .serve_options import add_serve_arguments

    p = commands.add_parser("serve", help="run the broker (RocketMQ 5 gRPC endpoint)")
    add_serve_arguments(p)
    p.set_defaults(func=_serve)

    topic = commands.add_parser("topic", help="create and list topics")
    sub = topic.add_subparsers(dest="topic_command", required=True)
    p = sub.add_parser("create", help="create a topic (or add queues to one)")
    p.add_argument("name")
    p.add_argument("--queues", type=int, default=None, help="queue count (default 8; a PRIORITY topic: one per level)")
    p.add_argument("--type", default="NORMAL", choices=["NORMAL", "FIFO", "DELAY", "TRANSACTION", "PRIORITY", "LITE"])
    p.add_argument(
        "--priorities",
        type=int,
        default=None,
        help="priority levels of a PRIORITY topic, one queue each (default 10: priorities 0-9)",
    )
    _target(p)
    p.set_defaults(func=_topic_create)
    p = sub.add_parser("list", help="topics with their queues' min and max offsets")
    _target(p)
    p.set_defaults(func=_topic_list)

    group = commands.add_parser("group", help="create and list consumer groups")
    sub = group.add_subparsers(dest="group_command", required=True)
    for command, text, func in (
        ("create", "create a consumer group (refused if it exists)", _group_create),
        ("update", "change an existing group's retry policy", _group_update),
    ):
        p = sub.add_parser(command, help=text)
        p.add_argument("name")
        p.add_argument(
            "--max-attempts", type=int, default=None, help="deliveries before the dead-letter queue (default 17)"
        )
        p.add_argument(
            "--retry-backoff-ms", default=None, help="comma-separated invisible times of successive push retries"
        )
        p.add_argument(
            "--fifo",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="deliver each message group in order (RocketMQ's consumeMessageOrderly); --no-fifo undoes it",
        )
        if command == "create":
            p.add_argument("--lite-bind-topic", default=None, help="make it a lite group of this LITE topic")
        _target(p)
        p.set_defaults(func=func)
    p = sub.add_parser("list", help="groups with, per queue, the consumed offset and the backlog")
    _target(p)
    p.set_defaults(func=_group_list)

    lite = commands.add_parser("lite", help="lite topics of a bind topic")
    sub = lite.add_subparsers(dest="lite_command", required=True)
    p = sub.add_parser("list", help="a bind topic's lite topics: backlog per lite group, subscribers")
    p.add_argument("bind_topic")
    p.add_argument("--prefix", default="", help="only lite topics starting with this")
    p.add_argument("--group", default=None, help="only this lite group")
    p.add_argument("--limit", type=int, default=10_000, help="list at most this many lite topics")
    _target(p)
    p.set_defaults(func=_lite_list)


def _serve(args: argparse.Namespace) -> int:
    from .server import run

    return run(args)


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, help=f"a running broker's HOST:PORT (default {DEFAULT_SERVER})")
    p.add_argument("--store", default=None, help="a stopped broker's store directory")
    p.add_argument("--json", action="store_true", help="print JSON")


def _call(args: argparse.Namespace, method: str, **arguments):
    from .broker import admin

    if args.store is None:
        import grpc

        from .protocol.grpc import admin_call

        address = args.server or DEFAULT_SERVER
        try:
            return admin_call(address, method, **arguments)
        except grpc.RpcError as exc:
            raise SystemExit(
                f"tidemq: cannot reach a broker at {address} ({exc.code().name}: {exc.details()}); "
                "give --server HOST:PORT, or --store DIR for a stopped broker"
            ) from None
    functions: dict[str, Callable[..., Any]] = {
        "CreateTopic": admin.create_topic,
        "ListTopics": admin.list_topics,
        "CreateGroup": admin.create_group,
        "UpdateGroup": admin.update_group,
        "ListGroups": admin.list_groups,
        "ListLite": admin.list_lite,
    }
    with _offline_broker(args.store) as broker:
        return functions[method](broker, **arguments)


@contextmanager
def _offline_broker(directory: str):
    from .broker import Broker
    from .cli import existing_store
    from .store import MessageStore

    store = MessageStore(existing_store(directory))
    try:
        broker = Broker(store)
        try:
            yield broker
        finally:
            broker.journal.close()
    finally:
        store.close()


def _print(args, value, lines) -> int:
    if args.json:
        print(json.dumps(value, indent=1))
    else:
        for line in lines:
            print(line)
    return 0


def _topic_create(args) -> int:
    t = _call(
        args, "CreateTopic", name=args.name, queue_nums=args.queues, message_type=args.type, priorities=args.priorities
    )
    levels = f" ({t['priorities']} priority levels)" if "priorities" in t else ""
    return _print(args, t, [f"topic {t['name']}: {t['queue_nums']} queues, {t['message_type']}{levels}"])


def _topic_list(args) -> int:
    topics = _call(args, "ListTopics")
    lines = []
    for t in topics:
        total = sum(q["max_offset"] - q["min_offset"] for q in t["queues"])
        levels = f" ({t['priorities']} priority levels)" if "priorities" in t else ""
        lines.append(f"{t['name']}  {t['message_type']}{levels}  {t['queue_nums']} queues  {total} messages")
        for q in t["queues"]:
            lines.append(f"  {t['name']}/{q['queue_id']}  min {q['min_offset']}  max {q['max_offset']}")
    return _print(args, topics, lines)


def _group_create(args, method: str = "CreateGroup") -> int:
    try:
        backoff = [int(x) for x in args.retry_backoff_ms.split(",")] if args.retry_backoff_ms else None
    except ValueError:
        raise SystemExit(
            f"tidemq: --retry-backoff-ms {args.retry_backoff_ms!r} is not a comma-separated list of ms"
        ) from None
    bind = getattr(args, "lite_bind_topic", None)
    g = _call(
        args,
        method,
        name=args.name,
        max_attempts=args.max_attempts,
        retry_backoff_ms=backoff,
        fifo=args.fifo,
        **({"lite_bind_topic": bind} if bind else {}),
    )
    order = ", FIFO" if g.get("fifo") else ""
    lite = f", lite group of {g['lite_bind_topic']}" if g.get("lite_bind_topic") else ""
    return _print(
        args,
        g,
        [f"group {g['name']}: max attempts {g['max_attempts']}, retry backoff {g['retry_backoff_ms']} ms{order}{lite}"],
    )


def _group_update(args) -> int:
    return _group_create(args, "UpdateGroup")


def _group_list(args) -> int:
    groups = _call(args, "ListGroups")
    lines = []
    for g in groups:
        lite = (
            f"  lite group of {g['lite_bind_topic']}  light queues {g.get('light_queues', 0)}"
            if g.get("lite_bind_topic")
            else ""
        )
        lines.append(f"{g['name']}  max attempts {g['max_attempts']}  dead letters {g['dead_letters']}{lite}")
        for t in g["topics"]:
            lines.append(f"  {t['topic']}  backlog {t['backlog']}")
            for q in t["queues"]:
                lines.append(
                    f"    {t['topic']}/{q['queue_id']}  consumed {q['consumed_offset']}  max {q['max_offset']}"
                    f"  backlog {q['backlog']}  in flight {q['in_flight']}"
                )
    return _print(args, groups, lines)


def _lite_list(args) -> int:
    listing = _call(
        args, "ListLite", bind_topic=args.bind_topic, prefix=args.prefix, group=args.group, limit=args.limit
    )
    groups = ", ".join(listing["groups"]) or "-"
    lines = [f"{listing['bind_topic']}  {len(listing['lite_topics'])} lite topics  lite groups: {groups}"]
    for t in listing["lite_topics"]:
        backlog = "  ".join(f"{g['group']} backlog {g['backlog']} in flight {g['in_flight']}" for g in t["groups"])
        lines.append(f"  {t['lite_topic']}  max {t['max_offset']}  subscribers {t['subscribers']}  {backlog}".rstrip())
    return _print(args, listing, lines)
