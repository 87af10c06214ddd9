"""SQL92 property filters (`FilterType.SQL`), with the grammar and the evaluation rules of
RocketMQ's filter module (a JMS message-selector subset).

Grammar, loosest binding first: `OR`; `AND`; `=`, `<>`, `IS [NOT] NULL`; `>`, `>=`, `<`, `<=`,
`[NOT] BETWEEN x AND y`, `[NOT] IN ('a', ...)`, `[NOT] CONTAINS|STARTSWITH|ENDSWITH 's'`; unary
`+`, `-`, `NOT`; literals (`'it''s'`, 10, 10L, 1.5, 1E3, TRUE, FALSE, NULL), property names
(`[a-zA-Z_$][a-zA-Z0-9_$]*`), parentheses, `--` and `/* */` comments.  Keywords ignore case.

Values are what RocketMQ's evaluator sees: a property is a string (or None when the message
does not have it, which includes `TAGS` on an untagged message); a decimal literal is a Java
int or long, a floating one a double.  Evaluation is three-valued (True, False, None for
unknown) and a message matches only when the whole expression is True:
- a comparison with a missing property is unknown; `AND`/`OR`/`NOT` propagate unknown as SQL;
- a string compared with a number is parsed as that number's Java type (`'10' > 5` is true,
  `'1.5' > 1` raises, because `1` is an int), two strings compared by `<`/`>` are parsed as
  doubles; a value that does not parse makes the evaluation fail, and a failed evaluation is
  no match (RocketMQ logs it and filters the message out);
- a property used as a boolean (`a AND b`) is False unless it is a boolean, which a property
  never is.
What RocketMQ rejects when it compiles an expression is rejected here too, as
ILLEGAL_FILTER_EXPRESSION: `x = NULL`, `'a' > 1`, `TRUE = 1`, `BETWEEN` with null or reversed
constant bounds, `IN` on anything but a property, a decimal beyond the long range, a float
literal that is infinite or below Double.MIN_VALUE, a top-level value that is not boolean.

Parsed with lark (LALR(1), pure Python): the grammar stays a readable table mirroring
RocketMQ's SelectorParser.jj, the contextual lexer handles keywords against names, and syntax
errors carry positions, which the status message passes on."""

from __future__ import annotations

import functools
import re

import lark

from .codes import BrokerError, Code

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr | or_expr OR and_expr -> or_
?and_expr: eq_expr | and_expr AND eq_expr -> and_
?eq_expr: cmp_expr
    | eq_expr "=" cmp_expr -> eq
    | eq_expr "<>" cmp_expr -> ne
    | eq_expr IS NULL -> is_null
    | eq_expr IS NOT NULL -> is_not_null
?cmp_expr: unary
    | cmp_expr ">" unary -> gt
    | cmp_expr ">=" unary -> ge
    | cmp_expr "<" unary -> lt
    | cmp_expr "<=" unary -> le
    | cmp_expr CONTAINS string -> contains
    | cmp_expr NOT CONTAINS string -> not_contains
    | cmp_expr STARTSWITH string -> startswith
    | cmp_expr NOT STARTSWITH string -> not_startswith
    | cmp_expr ENDSWITH string -> endswith
    | cmp_expr NOT ENDSWITH string -> not_endswith
    | cmp_expr BETWEEN unary AND unary -> between
    | cmp_expr NOT BETWEEN unary AND unary -> not_between
    | cmp_expr IN "(" string ("," string)* ")" -> in_
    | cmp_expr NOT IN "(" string ("," string)* ")" -> not_in
?unary: primary
    | "+" unary
    | "-" unary -> negate
    | NOT unary -> not_
?primary: string -> string_literal
    | DECIMAL -> decimal
    | FLOAT -> float_
    | TRUE -> true
    | FALSE -> false
    | NULL -> null
    | ID -> prop
    | "(" or_expr ")"
string: STRING

OR: /or\b/i
AND: /and\b/i
NOT: /not\b/i
IS: /is\b/i
NULL: /null\b/i
TRUE: /true\b/i
FALSE: /false\b/i
IN: /in\b/i
BETWEEN: /between\b/i
CONTAINS: /contains\b/i
STARTSWITH: /startswith\b/i
ENDSWITH: /endswith\b/i
ID.-1: /[a-zA-Z_$][a-zA-Z0-9_$]*/
FLOAT.2: /[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
DECIMAL: /(0|[1-9][0-9]*)[lL]?/
STRING: /'([^']|'')*'/
COMMENT: /--[^\n\r]*(\r\n|\n|\r)/ | /\/\*[^*]*\*+([^*\/][^*]*\*+)*\//
%ignore /[ \t\n\r\f]+/
%ignore COMMENT
"""


@functools.cache
def _parser() -> lark.Lark:
    """The LALR parser, built at the first SQL92 expression (building its tables takes a while)."""
    return lark.Lark(_GRAMMAR, parser="lalr", lexer="contextual", maybe_placeholders=False)


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MIN = 4.9e-324  # Java Double.MIN_VALUE


class _Long(int):
    """A Java long: a decimal literal outside the int range (a plain `int` is a Java int)."""


class _Failed(Exception):
    """An evaluation failure (a string that is not the number it is compared with): no match."""


class _Node:
    boolean = False  # a boolean expression (comparison, logic, TRUE/FALSE), as RocketMQ types them

    def value(self, props):
        raise NotImplementedError


class _Const(_Node):
    def __init__(self, value) -> None:
        self.constant = value
        self.boolean = isinstance(value, bool)

    def value(self, props):
        return self.constant


class _Prop(_Node):
    def __init__(self, name: str) -> None:
        self.name = name

    def value(self, props):
        return props.get(self.name)


class _Fn(_Node):
    """A boolean expression computed by `fn(props)`."""

    boolean = True

    def __init__(self, fn) -> None:
        self.fn = fn

    def value(self, props):
        return self.fn(props)


class _Negate(_Node):
    def __init__(self, operand: _Node) -> None:
        self.operand = operand

    def value(self, props):
        v = self.operand.value(props)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return type(v)(-v) if isinstance(v, _Long) else -v


# -- RocketMQ's comparison of two values (ComparisonExpression.__compare, strings converted) --

_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def _to_java_number(text: str, like):
    """`text` parsed as the Java type of `like` (Integer/Long.valueOf, Double.valueOf)."""
    if isinstance(like, float):
        t = text.strip()
        if t[-1:] in "dDfF" and t[:-1]:
            t = t[:-1]
        try:
            return float(t)
        except ValueError:
            raise _Failed(f"{text!r} is not a number") from None
    if not _JAVA_INT.fullmatch(text):
        raise _Failed(f"{text!r} is not an integer")
    n = int(text)
    low, high = (_LONG_MIN, _LONG_MAX) if isinstance(like, _Long) else (_INT_MIN, _INT_MAX)
    if not low <= n <= high:
        raise _Failed(f"{text!r} is out of range")
    return n


def _compare(lv, rv) -> int:
    lnum = isinstance(lv, (int, float)) and not isinstance(lv, bool)
    rnum = isinstance(rv, (int, float)) and not isinstance(rv, bool)
    if isinstance(lv, bool):
        if isinstance(rv, bool):
            return (lv > rv) - (lv < rv)
        if isinstance(rv, str):
            raise _Failed("a boolean compared with a string")  # Java's cast fails here
        return -1
    if lnum:
        if rnum:
            pass
        elif isinstance(rv, str):
            rv = _to_java_number(rv, lv)
        else:
            return -1
    elif isinstance(lv, str):
        if isinstance(rv, str):
            pass
        elif isinstance(rv, bool):
            lv = lv.lower() == "true"
        elif rnum:
            lv = _to_java_number(lv, rv)
        else:
            return -1
    else:
        return -1
    return (lv > rv) - (lv < rv)


def _equal(left: _Node, right: _Node):
    def fn(props):
        lv, rv = left.value(props), right.value(props)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or (type(lv) is type(rv) and lv == rv):
            return True
        return _compare(lv, rv) == 0

    return _Fn(fn)


def _ordering(left: _Node, right: _Node, test):
    for operand in (left, right):
        if operand.boolean or (isinstance(operand, _Const) and not _is_number(operand.constant)):
            raise _Invalid(f"value {_show(operand)} cannot be compared")

    def fn(props):
        lv = left.value(props)
        if lv is None:
            return None
        rv = right.value(props)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            lv, rv = _to_java_number(lv, 0.0), _to_java_number(rv, 0.0)
        return test(_compare(lv, rv))

    return _Fn(fn)


def _not(operand: _Node) -> _Node:
    operand = _as_boolean(operand)

    def fn(props):
        v = operand.value(props)
        return None if v is None else not v

    return _Fn(fn)


def _logic(left: _Node, right: _Node, decisive: bool) -> _Node:
    """AND (`decisive` False) or OR (True), three-valued: an operand equal to `decisive`
    decides; otherwise unknown if either is unknown."""
    left, right = _as_boolean(left), _as_boolean(right)

    def fn(props):
        lv = left.value(props)
        if lv is decisive:
            return decisive
        rv = right.value(props)
        if rv is decisive:
            return decisive
        return None if lv is None or rv is None else not decisive

    return _Fn(fn)


def _and(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, False)


def _or(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, True)


def _as_boolean(node: _Node) -> _Node:
    """RocketMQ's asBooleanExpression: booleans as they are, a property cast (True only if it is
    a boolean), anything else a compile error."""
    if node.boolean:
        return node
    if isinstance(node, _Prop):
        return _Fn(lambda props: None if (v := node.value(props)) is None else v is True)
    raise _Invalid(f"expression {_show(node)} will not result in a boolean value")


def _text_test(operand: _Node, search: str, test, negated: bool) -> _Node:
    def fn(props):
        if not search:
            return False
        v = operand.value(props)
        if not isinstance(v, str):
            return False
        return test(v, search) != negated

    return _Fn(fn)


def _in(operand: _Node, items: list[str], negated: bool) -> _Node:
    if not isinstance(operand, _Prop):
        raise _Invalid(f"expected a property for IN, got {_show(operand)}")
    members = frozenset(items)

    def fn(props):
        v = operand.value(props)
        if not isinstance(v, str):
            return None
        return (v in members) != negated

    return _Fn(fn)


def _between(value: _Node, low: _Node, high: _Node) -> _Node:
    if isinstance(low, _Const) and isinstance(high, _Const):
        if low.constant is None or high.constant is None:
            raise _Invalid("the bounds of BETWEEN cannot be null")
        try:
            reversed_bounds = _compare(high.constant, low.constant) < 0
        except _Failed:
            reversed_bounds = False
        if reversed_bounds:
            raise _Invalid(f"BETWEEN bounds reversed: {_show(low)} is above {_show(high)}")
    return _and(_ordering(value, low, lambda c: c >= 0), _ordering(value, high, lambda c: c <= 0))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(node: _Node) -> str:
    if isinstance(node, _Prop):
        return node.name
    if isinstance(node, _Const):
        v = node.constant
        return "NULL" if v is None else "TRUE" if v is True else "FALSE" if v is False else repr(v)
    return "(expression)"


class _Invalid(Exception):
    """An expression RocketMQ refuses to compile."""


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'")


def _decimal(text: str) -> _Node:
    n = int(text.rstrip("lL"))
    if n > _LONG_MAX:
        raise _Invalid(f"decimal {text} is beyond the long range")
    return _Const(n if n <= _INT_MAX else _Long(n))


def _float(text: str) -> _Node:
    v = float(text)
    if v == float("inf"):
        raise _Invalid(f"{text} is greater than Double.MAX_VALUE")
    if v < _DOUBLE_MIN:
        raise _Invalid(f"{text} is less than Double.MIN_VALUE")
    return _Const(v)


def _string(tree, depth: int) -> str:
    """The text of a `string` tree (a quoted literal)."""
    if depth > MAX_DEPTH:
        raise _Invalid(f"nested deeper than {MAX_DEPTH}")
    token = tree.children[0] if isinstance(tree, lark.Tree) and tree.data == "string" else None
    if not isinstance(token, lark.Token):
        raise _Invalid(f"unexpected {tree}")
    return _unquote(token)


def _build(tree, depth: int = 0) -> _Node:
    """The evaluator of a parse tree (bottom up, with RocketMQ's compile-time checks)."""
    if depth > MAX_DEPTH:
        raise _Invalid(f"nested deeper than {MAX_DEPTH}")

    def sub(t) -> _Node:
        return _build(t, depth + 1)

    def text(t) -> str:
        return _string(t, depth + 1)

    if isinstance(tree, lark.Token):
        raise _Invalid(f"unexpected {tree}")
    kind, c = tree.data, tree.children
    if kind == "string_literal":
        return _Const(text(c[0]))
    if kind == "decimal":
        return _decimal(c[0])
    if kind == "float_":
        return _float(c[0])
    if kind in ("true", "false", "null"):
        return _Const({"true": True, "false": False, "null": None}[kind])
    if kind == "prop":
        return _Prop(str(c[0]))
    if kind == "unary":  # "+" x
        return sub(c[0])
    if kind == "negate":
        return _Negate(sub(c[0]))
    if kind == "not_":
        return _not(sub(c[1]))
    if kind == "or_":
        return _or(sub(c[0]), sub(c[2]))
    if kind == "and_":
        return _and(sub(c[0]), sub(c[2]))
    left = sub(c[0])
    if kind in ("eq", "ne"):
        right = sub(c[1])
        for operand in (left, right):
            if isinstance(operand, _Const) and operand.constant is None:
                raise _Invalid("NULL cannot be compared with '=' (use IS NULL)")
        if isinstance(left, _Const) and isinstance(right, _Const) and left.boolean and not right.boolean:
            raise _Invalid(f"{_show(left)} cannot be compared with {_show(right)}")
        equal = _equal(left, right)
        return equal if kind == "eq" else _not(equal)
    if kind == "is_null":
        return _equal(left, _Const(None))
    if kind == "is_not_null":
        return _not(_equal(left, _Const(None)))
    tests = {"gt": lambda r: r > 0, "ge": lambda r: r >= 0, "lt": lambda r: r < 0, "le": lambda r: r <= 0}
    if kind in tests:
        return _ordering(left, sub(c[1]), tests[kind])
    texts = {"contains": str.__contains__, "startswith": str.startswith, "endswith": str.endswith}
    negated = kind.startswith("not_")
    name = kind[4:] if negated else kind
    if name in texts:
        return _text_test(left, text(c[-1]), texts[name], negated)
    if kind == "between":
        return _between(left, sub(c[2]), sub(c[4]))
    if kind == "not_between":
        low, high = sub(c[3]), sub(c[5])
        return _or(_ordering(left, low, lambda r: r < 0), _ordering(left, high, lambda r: r > 0))
    if name == "in_" or kind == "not_in":
        items = [text(t) for t in c[1:] if isinstance(t, lark.Tree)]
        return _in(left, items, negated)
    raise _Invalid(f"unknown construct {kind}")


class SqlFilter:
    """A compiled SQL92 filter.  Consume-queue tags codes cannot decide it: every unit's record
    is read and its properties evaluated."""

    __slots__ = ("expression", "_root")

    def __init__(self, expression: str, root: _Node) -> None:
        self.expression = expression
        self._root = root

    def matches_code(self, tags_code: int) -> bool:
        return True

    def matches_properties(self, properties: dict[str, str]) -> bool:
        try:
            return self._root.value(properties) is True
        except (_Failed, TypeError, ValueError, OverflowError):
            return False

    def accepts(self, rec) -> bool:
        return self.matches_properties(rec.properties)


MAX_EXPRESSION_LENGTH = 64 * 1024  # characters; a longer expression is refused unparsed
MAX_DEPTH = 256  # nesting of the built evaluator (each level is a call when a message is tested)


def compile_sql(expression: str) -> SqlFilter:
    """Parse `expression`; BrokerError ILLEGAL_FILTER_EXPRESSION when RocketMQ would refuse it."""
    text = expression or ""
    if not text.strip():
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filter expression is blank")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise BrokerError(
            Code.ILLEGAL_FILTER_EXPRESSION, f"SQL92 filter expression longer than {MAX_EXPRESSION_LENGTH} characters"
        )
    try:
        root = _as_boolean(_build(_parser().parse(text)))
    except lark.exceptions.LarkError as exc:
        raise BrokerError(
            Code.ILLEGAL_FILTER_EXPRESSION, f"bad SQL92 filter expression {text!r}: {_first_line(exc)}"
        ) from None
    except _Invalid as exc:
        raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, f"bad SQL92 filter expression {text!r}: {exc}") from None
    return SqlFilter(text, root)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
