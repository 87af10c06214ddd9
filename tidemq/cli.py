"""The `tidemq` command."""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path


def existing_store(directory: str) -> Path:
    """`directory` if it holds a store; else SystemExit with one line (commands that open a store
    never create one where the user made a typo)."""
    path = Path(directory)
    if not path.is_dir():
        raise SystemExit(f"tidemq: no store at {directory}: no such directory")
    if not (path / "commitlog").is_dir():
        raise SystemExit(f"tidemq: no store at {directory}: it has no commitlog directory")
    return path


def _store_inspect(args: argparse.Namespace) -> int:
    from .store.recovery import check

    existing_store(args.dir)
    segments, queues, log_end = check.inspect(Path(args.dir))
    print(f"store {args.dir}")
    print(f"commit log: {len(segments)} segment(s), end offset {log_end}")
    for s in segments:
        print(f"  {s.name}  {s.used:>12} / {s.size} bytes  {s.records} records")
    covered = max((q.max_physical_offset for q in queues), default=0)
    from .store.dispatch.lag import offline_lags

    lags = offline_lags(Path(args.dir), log_end, covered)
    print(
        f"dispatch lag: {max((behind for behind, _ in lags.values()), default=0)} bytes behind the log end, per index:"
    )
    for sink, (behind, millis) in lags.items():
        print(f"  {sink}: {behind} bytes, {millis} ms behind")
    print(f"queues: {len(queues)}")
    for q in queues:
        print(f"  {q.topic}/{q.queue_id}  min {q.min_offset}  max {q.max_offset}")
    from .store.light.kv import offline_count
    from .store.light.queues import KV_DIRECTORY

    light = offline_count(Path(args.dir) / KV_DIRECTORY)
    files = sum(1 for q in queues if q.topic.startswith("%LMQ%"))
    if light is not None or files:
        count, dispatched = light or (0, 0)
        print(
            f"light queues: {count + files} ({count} in the key-value tables, dispatched to offset {dispatched}; "
            f"{files} file queues)"
        )
    return 0


def _store_check(args: argparse.Namespace) -> int:
    from .broker.pop_journal import check_journal
    from .store.recovery import check

    report = check.check(existing_store(args.dir))
    report.problems += check_journal(Path(args.dir) / "pop")
    for problem in report.problems:
        print(f"problem: {problem}")
    verdict = "sound" if report.sound else f"NOT sound ({len(report.problems)} problem(s))"
    print(f"checked {report.records} records and {report.units} consume-queue units: {verdict}")
    return 0 if report.sound else 1


def _store_repair(args: argparse.Namespace) -> int:
    from .broker.pop_journal import repair_journal
    from .store import MessageStore, StoreConfig
    from .store.light.repair import repair_file_units
    from .store.recovery import check

    directory = existing_store(args.dir)
    # light queues' units against the log: file queues mended before the store opens, the
    # key-value tables through it
    light_fixes = check.check(directory).light_fixes
    fixed = repair_file_units(directory, light_fixes) if light_fixes else 0
    store = MessageStore(directory, StoreConfig(repair=True))
    messages = list(store.recovery.messages)
    if light_fixes and store.light_queues is not None:
        fixed += store.light_queues.repair_units(light_fixes)
    if fixed:
        messages.append(f"light queues: {fixed} unit(s) rewritten from the log or removed")
    store.close()
    journal = repair_journal(directory / "pop", directory / "repair")
    if journal is not None:
        messages.append(journal)
    for line in messages or ["nothing to repair"]:
        print(line)
    return 0


def _store_query(args: argparse.Namespace) -> int:
    from .store.index import key_index

    if args.id:
        found = key_index.find_by_id(Path(args.dir), args.id, args.topic)
    elif args.topic and args.key:
        found = key_index.query_directory(Path(args.dir), args.topic, args.key, args.begin, args.end, args.max)
    else:
        print("tidemq: store query needs --id ID, or --topic T --key K", file=sys.stderr)
        return 2
    for rec in found:
        keys = " ".join(rec.keys)
        print(
            f"{rec.msg_id}  {rec.topic}/{rec.queue_id} offset {rec.queue_offset}  stored {rec.store_timestamp}  "
            f"uniq {rec.unique_key or '-'}  keys [{keys}]  {rec.total_size} bytes  body {rec.body_bytes[:64]!r}"
        )
    print(f"{len(found)} message(s)")
    return 0 if found else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="tidemq", description="tidemq message broker and store")
    parser.add_argument("--version", action="version", version=f"tidemq {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    commands = parser.add_subparsers(dest="command", required=True)

    store = commands.add_parser("store", help="inspect, check and repair a store directory")
    store_commands = store.add_subparsers(dest="store_command", required=True)
    p = store_commands.add_parser("inspect", help="segments, queues with min/max offsets, dispatch lag")
    p.add_argument("dir")
    p.set_defaults(func=_store_inspect)
    p = store_commands.add_parser("check", help="verify every record and consume-queue unit; exit 1 if unsound")
    p.add_argument("dir")
    p.set_defaults(func=_store_check)
    p = store_commands.add_parser("repair", help="open with repair: cut the log at a corrupt record, rebuild indexes")
    p.add_argument("dir")
    p.set_defaults(func=_store_repair)
    p = store_commands.add_parser("query", help="find messages by id (offset id or UNIQ_KEY) or by key; exit 1 if none")
    p.add_argument("dir")
    p.add_argument("--id", help="offset message id or UNIQ_KEY (client message id)")
    p.add_argument("--topic", help="topic of the key (narrows --id)")
    p.add_argument("--key", help="a KEYS entry or UNIQ_KEY")
    p.add_argument("--begin", type=int, default=0, help="earliest store time, ms since the epoch")
    p.add_argument("--end", type=int, default=2**63 - 1, help="latest store time, ms since the epoch")
    p.add_argument("--max", type=int, default=64, help="at most this many messages (64)")
    p.set_defaults(func=_store_query)
    from .broker_cli import register as register_broker_commands

    register_broker_commands(commands)
    from .lookup_cli import register as register_lookup_commands

    register_lookup_commands(commands)
    from .pipeline.cli import add_commands as add_pipeline_commands

    add_pipeline_commands(commands)
    _verbose_after_subcommands(parser)
    return parser


def _verbose_after_subcommands(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)command take -v too, as well as before it: argparse gives each subparser
    its own flags.  SUPPRESS: a subcommand without -v leaves the top-level value alone."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if "-v" not in sub._option_string_actions:
                    sub.add_argument(
                        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at debug level"
                    )
                _verbose_after_subcommands(sub)


EXIT_DISK_FULL = 3  # a command stopped for want of disk space (nothing half done: start it again)


def disk_full(exc: OSError, args: argparse.Namespace) -> str:
    """One line for a write the disk refused for want of space: the path it names, else the
    command's store directory."""
    where = exc.filename or getattr(args, "store", None) or getattr(args, "dir", None) or "the working directory"
    return f"the disk of {where} is full ({exc.strerror or exc}): free space, then try again"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except Exception as exc:  # the command's user gets one line, not a traceback
        from .broker import BrokerError
        from .store import StoreError

        if isinstance(exc, BrokerError):
            print(f"tidemq: {exc.code.name}: {exc.message}", file=sys.stderr)
            return 2
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            print(f"tidemq: {disk_full(exc, args)}", file=sys.stderr)
            return EXIT_DISK_FULL
        if isinstance(exc, (StoreError, OSError, ValueError)):  # OSError: a port in use, a missing file
            print(f"tidemq: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
