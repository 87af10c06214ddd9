"""Filter expressions of a subscription: tags (`*`, or `A || B || C`) or SQL92 over the
message's properties (`sql_filter`).  Both answer `matches_code` (may a consume-queue unit's
tags code match: skip the record read when not) and `accepts` (does the record match)."""

from __future__ import annotations

from dataclasses import dataclass

from ..store import record
from .codes import BrokerError, Code
from .sql_filter import SqlFilter, compile_sql

SUBSCRIBE_ALL = "*"


@dataclass(frozen=True, slots=True)
class TagFilter:
    tags: frozenset[str] | None  # None: every message
    codes: frozenset[int] | None  # tags codes, to skip consume-queue units before reading records

    def matches_code(self, tags_code: int) -> bool:
        return self.codes is None or tags_code in self.codes

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)

    def accepts(self, rec) -> bool:
        return self.tags is None or rec.tags in self.tags


MATCH_ALL = TagFilter(None, None)

Filter = TagFilter | SqlFilter


def parse_filter(expression_type: str, expression: str) -> Filter:
    """`expression_type` is "TAG" or "SQL"."""
    if expression_type == "SQL":
        return compile_sql(expression)
    if expression_type != "TAG":
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, f"unknown filter expression type {expression_type!r}")
    text = (expression or "").strip()
    if not text or text == SUBSCRIBE_ALL:
        return MATCH_ALL
    tags = [t.strip() for t in text.split("||")]
    if any(not t or t == SUBSCRIBE_ALL or "|" in t for t in tags):
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, f"filter expression {expression!r} is not '*' or 'A || B'")
    return TagFilter(frozenset(tags), frozenset(record.tags_code(t) for t in tags))
