"""Tag filter expressions: `*` (everything) or `A || B || C`."""

from __future__ import annotations

from dataclasses import dataclass

from ..store import record
from .codes import BrokerError, Code

SUBSCRIBE_ALL = "*"


@dataclass(frozen=True, slots=True)
class TagFilter:
    tags: frozenset[str] | None  # None: every message
    codes: frozenset[int] | None  # tags codes, to skip consume-queue units before reading records

    def matches_code(self, tags_code: int) -> bool:
        return self.codes is None or tags_code in self.codes

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)


MATCH_ALL = TagFilter(None, None)


def parse_filter(expression_type: str, expression: str) -> TagFilter:
    """`expression_type` is "TAG" or "SQL"; SQL92 filtering is a later issue."""
    if expression_type == "SQL":
        raise BrokerError(Code.NOT_IMPLEMENTED, "SQL92 filter expressions are not supported yet")
    if expression_type != "TAG":
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, f"unknown filter expression type {expression_type!r}")
    text = (expression or "").strip()
    if not text or text == SUBSCRIBE_ALL:
        return MATCH_ALL
    tags = [t.strip() for t in text.split("||")]
    if any(not t or t == SUBSCRIBE_ALL or "|" in t for t in tags):
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, f"filter expression {expression!r} is not '*' or 'A || B'")
    return TagFilter(frozenset(tags), frozenset(record.tags_code(t) for t in tags))
