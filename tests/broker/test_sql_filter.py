"""SQL92 property filters: RocketMQ's grammar and evaluation rules (a table of expressions
against properties, the cases of RocketMQ's ParserTest and ExpressionTest that apply to string
properties), and what a filtered pop does to a group's progress."""

import pytest

from tidemq.broker import BrokerError, Code, admin
from tidemq.broker.sql_filter import compile_sql


def matches(expression: str, **properties) -> bool:
    return compile_sql(expression).matches_properties(properties)


PROPS = {"a": "3", "b": "5", "s": "hello", "f": "3.14", "big": "3000000000", "flag": "true", "TAGS": "paid"}


@pytest.mark.parametrize("expression, expected", [
    # comparisons: a string property against a number is read as that number's Java type
    ("a = 3", True), ("a = 4", False), ("a <> 4", True), ("a > 2", True), ("a >= 3", True), ("a < 3", False),
    ("a <= 3", True), ("a = 3.0", True), ("f > 3", False), ("f > 3.1", True), ("f = 3.14", True),
    ("big > 2147483647", False), ("big > 2147483647L", False),  # a literal that fits is an int, even with L
    ("big > 2147483648", True), ("big = 3000000000", True),
    ("a > b", False), ("b > a", True),  # two strings by '>' are compared as doubles
    ("s = 'hello'", True), ("s = 'Hello'", False), ("s <> 'x'", True), ("s > 1", False),  # 'hello' is no number
    # BETWEEN, IN
    ("a BETWEEN 1 AND 3", True), ("a between 4 and 10", False), ("a NOT BETWEEN 4 AND 10", True),
    ("s BETWEEN 1 AND 10", False), ("a IN ('1', '3')", True), ("a in ('1')", False), ("a NOT IN ('1')", True),
    ("missing IN ('1')", False), ("missing NOT IN ('1')", False),
    # NULL handling: a missing property is unknown, so neither a test nor its negation holds
    ("missing IS NULL", True), ("a IS NULL", False), ("a IS NOT NULL", True), ("missing IS NOT NULL", False),
    ("missing = 1", False), ("missing <> 1", False), ("NOT (missing = 1)", False), ("missing > 1", False),
    ("missing = 1 OR a = 3", True), ("missing = 1 AND a = 3", False), ("missing = 1 OR a = 4", False),
    ("NOT (missing = 1 AND a = 4)", True),  # unknown AND false is false
    # booleans, logic, precedence, case
    ("flag = TRUE", True), ("flag = FALSE", False), ("TRUE", True), ("FALSE OR a = 3", True),
    ("a = 3 AND b = 5 OR s = 'x'", True), ("a = 4 AND (b = 5 OR s = 'hello')", False),
    ("NOT a = 4 OR TRUE", True), ("flag", False), ("a=3 and b<>4 And b>4 AND a<=3", True),
    ("-a < 0", False),  # negating a string property gives unknown
    ("a > -1", True), ("a > +2", True), ("a > 2.5E0", True), ("a < .5e1", True),
    # TAGS is a property like the others
    ("TAGS = 'paid'", True), ("TAGS IN ('paid', 'refunded')", True), ("TAGS IS NULL", False),
    # strings with quotes, comments
    ("s = 'it''s'", False), ("s = 'hello' -- trailing comment\n", True), ("/* c */ s = 'hello'", True),
    # RocketMQ's CONTAINS / STARTSWITH / ENDSWITH
    ("s CONTAINS 'ell'", True), ("s NOT CONTAINS 'ell'", False), ("s STARTSWITH 'he'", True),
    ("s ENDSWITH 'lo'", True), ("s CONTAINS ''", False), ("s NOT CONTAINS ''", False), ("missing NOT CONTAINS 'x'", False),
])
def test_expression_table(expression, expected):
    assert matches(expression, **PROPS) is expected


@pytest.mark.parametrize("expression", [
    "", "   ", "a >", "a = ", "a == 3", "a and between 2 and 10", " a between 10 and 0",
    "a > 100000000000000000000000", "a > 0.0", "a = NULL", "NULL = a", "'a' > 1", "a > TRUE", "TRUE = 1",
    "s > 'a'", "3", "'text'", "a = 3 AND 4", "1 IN ('1')", "a IN ()", "a IN (1, 2)", "value contains x",
    "value contains 123", "'axb' contains ", "a BETWEEN NULL AND 3", "(a = 1", "a = 1)", "a = 'unterminated",
    "a = 3 b = 4", "a ! 3", "a = 3;",
])
def test_bad_expressions_are_illegal_filter_expressions(expression):
    with pytest.raises(BrokerError) as err:
        compile_sql(expression)
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def test_nesting_is_bounded():
    assert matches("(" * 5000 + "a = 1" + ")" * 5000, a="1")  # parentheses add no level
    for deep in ("NOT " * 5000 + "a = 1", " AND ".join(["a = 1"] * 5000), "-" * 5000 + "a > 1"):
        with pytest.raises(BrokerError) as err:
            compile_sql(deep)
        assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def test_rocketmq_parser_test_cases():
    """filter/src/test/.../ParserTest: the valid expressions parse, the invalid ones do not."""
    for expression in ("a=3 and b<>4 And c>5 AND d<=4", "a=3 or b<>4 Or c>5 OR d<=4", "a in ('3', '4', '5')",
                       "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))",
                       "(a between 2 and 10) AND (b not between 6 and 9)", "a is null", "a is not null",
                       "a <= now", "a=3 and b contains 'xxx' and c not contains 'xxx'",
                       "a=3  and    b<>4 And c>5 AND d<=4"):
        compile_sql(expression)
    for expression in ("a and between 2 and 10", " a between 10 and 0", "a > 100000000000000000000000",
                       "a > " + "1" * 400 + "." + "1" * 400 + "E400"):
        with pytest.raises(BrokerError):
            compile_sql(expression)


@pytest.mark.parametrize("expression, properties, expected", [
    # filter/src/test/.../ExpressionTest, with the values a message's properties can have (strings)
    ("a=3 and b<>4 And c>5 AND d<=4", dict(a="3", b="3", c="6", d="4"), True),
    ("a=3 and b<>4 And c>5 AND d<=4", dict(a="4", b="3", c="6", d="4"), False),
    ("a=3 or b<>4 Or c>5 OR d<=4", dict(a="4", b="4", c="5", d="5"), False),
    ("a in ('3', '4', '5')", dict(a="4"), True), ("a not in ('3', '4', '5')", dict(a="4"), False),
    ("a between 2 and 10", dict(a="2"), True), ("a not between 2 and 10", dict(a="10"), False),
    ("a is null", dict(), True), ("a is not null", dict(a="x"), True),
    ("a is not null and a='hello'", dict(a="hello"), True),
    ("a=TRUE OR b=FALSE", dict(a="true"), True), ("a=TRUE OR b=FALSE", dict(a="false", b="true"), False),
    ("a is null OR a='hello'", dict(), True), ("a is null OR a='hello'", dict(a="abc"), False),
    ("TAGS is not null and TAGS='''''tag'''''", dict(TAGS="''tag''"), True),
    ("a between up and low", dict(a="3.14"), False),
    ("a between up and low", dict(a="3.14", up="up", low="low"), False),
    ("key is not null and key between 0 and 100", dict(key="con"), False),
    ("a between 0 and 100", dict(a="abc"), False),
    ("a=b", dict(a="3.14", b="3.14"), True), ("a<>b", dict(a="3.14", b="3.14"), False),
    ("a<>b", dict(a="3.14", b="3.141"), True),
    ("a > 3.1E10", dict(a=str(3.1415 * 10**10)), True), ("a > 3.14", dict(a="3.1415"), True),
    ("a > b", dict(a="10", b="20"), False), ("a > b", dict(a="20", b="10"), True),
    ("value contains 'x'", dict(value="axb"), True), ("value startswith 'ax'", dict(value="axb"), True),
    ("value endswith 'xb'", dict(value="axb"), True), ("value not contains 'x'", dict(value="abb"), True),
    ("value not startswith 'x'", dict(value="abb"), True), ("value contains 'x'", dict(), False),
    ("value not contains 'x'", dict(), False), ("'axb' contains 'x'", dict(), True),
    ("'axb' not endswith 'u'", dict(), True), ("' ' startswith ' '", dict(), True),
    ("'axb' contains '.'", dict(), False), ("'s' contains '\\'", dict(), False),
    ("a not in ('4', '4', '5') and b between 3 and 10 and c not contains 'axbc'", dict(a="3", b="3", c="axbdc"), True),
])
def test_rocketmq_expression_test_cases(expression, properties, expected):
    assert matches(expression, **properties) is expected


def test_a_sql_subscription_receives_exactly_the_matching_messages_and_the_group_moves_past_the_rest(harness):
    admin.create_topic(harness.broker, "S", 1)
    for i in range(10):
        harness.send("S", f"m{i}".encode(), tag="even" if i % 2 == 0 else "odd", properties={"n": str(i)})
    got = harness.receive("G", "S", expression="n >= 4 AND TAGS = 'even'", filter_type="SQL")
    assert sorted(r.record.body for r in got) == [b"m4", b"m6", b"m8"]
    for r in got:
        harness.broker.ack("G", "S", r.receipt_handle)
    (group,) = [g for g in admin.list_groups(harness.broker) if g["name"] == "G"]
    (queue,) = group["topics"][0]["queues"]
    assert queue["consumed_offset"] == 10 and queue["backlog"] == 0  # filtered-out ones hold nothing back


def test_a_bad_sql_subscription_is_refused_at_receive(harness):
    with pytest.raises(BrokerError) as err:
        harness.receive("G", "S", expression="n >", filter_type="SQL")
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION
