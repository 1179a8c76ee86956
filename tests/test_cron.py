"""Schedule time logic (SPEC §9): which minutes a cron expression names, in UTC.

No test freezes the clock: every function under test takes its times as arguments.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from core.clock import iso, parse_iso
from core.cron import CronSpec, due_slots, matches, next_slot, parse_cron
from core.errors import InvalidInput

HOUR_MS = 3_600_000


def at(text: str) -> int:
    return parse_iso(text + "Z")


def following(expr: str, after: str, count: int) -> list[str]:
    """The next `count` slots after `after`, as ISO text."""
    spec, slots, cursor = parse_cron(expr), [], at(after)
    for _ in range(count):
        cursor = next_slot(spec, cursor)
        slots.append(iso(cursor))
    return slots


# --- next_slot -------------------------------------------------------------------------


def test_every_15_minutes_fires_on_the_quarter_hours() -> None:
    assert following("*/15 * * * *", "2025-03-10T10:07:00", 4) == [
        "2025-03-10T10:15:00.000Z",
        "2025-03-10T10:30:00.000Z",
        "2025-03-10T10:45:00.000Z",
        "2025-03-10T11:00:00.000Z",
    ]


def test_next_slot_is_strictly_after_a_slot_it_is_given() -> None:
    assert following("0 * * * *", "2025-03-10T10:00:00", 1) == ["2025-03-10T11:00:00.000Z"]


def test_next_slot_from_inside_a_minute_is_the_next_whole_minute() -> None:
    spec = parse_cron("* * * * *")
    assert next_slot(spec, at("2025-03-10T10:00:00") + 1) == at("2025-03-10T10:01:00")


def test_weekday_morning_skips_the_weekend() -> None:
    # 2025-03-07 is a Friday.
    assert following("30 7 * * 1-5", "2025-03-07T08:00:00", 2) == [
        "2025-03-10T07:30:00.000Z",
        "2025-03-11T07:30:00.000Z",
    ]


def test_the_31st_skips_months_of_30_days() -> None:
    assert following("0 0 31 * *", "2025-03-31T12:00:00", 2) == [
        "2025-05-31T00:00:00.000Z",
        "2025-07-31T00:00:00.000Z",
    ]


def test_29_february_waits_for_the_leap_year() -> None:
    assert following("0 12 29 2 *", "2027-01-01T00:00:00", 1) == ["2028-02-29T12:00:00.000Z"]


def test_restricted_day_of_month_and_day_of_week_fire_on_either() -> None:
    # Vixie: both fields restricted -> the 13th OR any Friday. 2025-06-13 is a Friday.
    assert following("0 0 13 * 5", "2025-06-01T00:00:00", 4) == [
        "2025-06-06T00:00:00.000Z",
        "2025-06-13T00:00:00.000Z",
        "2025-06-20T00:00:00.000Z",
        "2025-06-27T00:00:00.000Z",
    ]
    assert following("0 0 13 * 5", "2025-07-01T00:00:00", 2) == [
        "2025-07-04T00:00:00.000Z",
        "2025-07-11T00:00:00.000Z",
    ]
    assert following("0 0 13 * 5", "2025-07-11T00:00:00", 1) == ["2025-07-13T00:00:00.000Z"]


def test_a_starred_step_in_day_of_month_intersects_with_day_of_week() -> None:
    # Vixie treats a field starting with '*' as unrestricted for the OR rule, so
    # `*/2` (odd days) and Monday must BOTH hold. croniter's default would OR them.
    # 2025-01-06 is a Monday on an even day; 2025-01-13 is a Monday on an odd day.
    assert following("0 0 */2 * 1", "2025-01-01T00:00:00", 3) == [
        "2025-01-13T00:00:00.000Z",
        "2025-01-27T00:00:00.000Z",
        "2025-02-03T00:00:00.000Z",
    ]


def test_a_full_range_day_of_month_is_restricted_and_ors_with_day_of_week() -> None:
    # `1-31` does not start with '*': Vixie ORs it with Monday, so every day fires.
    assert following("0 0 1-31 * 1", "2025-01-01T00:00:00", 2) == [
        "2025-01-02T00:00:00.000Z",
        "2025-01-03T00:00:00.000Z",
    ]


def test_only_a_leading_star_makes_a_day_field_unrestricted() -> None:
    # `5,*/7` starts with '5': restricted, so the 13th OR Friday OR Sunday fires.
    # 2025-07-11 is a Friday, 07-13 a Sunday and the 13th.
    assert following("0 0 13 * 5,*/7", "2025-07-11T00:00:00", 2) == [
        "2025-07-13T00:00:00.000Z",
        "2025-07-18T00:00:00.000Z",
    ]


def test_an_impossible_day_of_month_leaves_the_weekday_side_of_an_or() -> None:
    # 2025-02-03 is a Monday.
    assert following("0 0 31 2 mon", "2025-02-01T00:00:00", 2) == [
        "2025-02-03T00:00:00.000Z",
        "2025-02-10T00:00:00.000Z",
    ]


def test_month_and_weekday_names_are_accepted_in_any_case() -> None:
    # 2025-01-31 is a Friday; the next weekday in January or July is 2025-07-01.
    assert following("0 9 * JAN,jul Mon-FRI", "2025-01-31T10:00:00", 2) == [
        "2025-07-01T09:00:00.000Z",
        "2025-07-02T09:00:00.000Z",
    ]


def test_a_one_value_range_names_only_that_value() -> None:
    # croniter 7.0 alone would read `5-5` as `*`; our parser does not.
    assert following("5-5 * * * *", "2025-03-10T10:00:00", 2) == [
        "2025-03-10T10:05:00.000Z",
        "2025-03-10T11:05:00.000Z",
    ]


def test_day_of_week_7_is_sunday() -> None:
    assert parse_cron("0 0 * * 7").weekdays == parse_cron("0 0 * * sun").weekdays == {0}


def test_a_29_february_that_is_also_a_sunday_is_found_decades_ahead() -> None:
    # `*/7` starts with '*', so day of month and Sunday must both hold: 2032, then 2060.
    assert following("0 0 29 2 */7", "2004-03-01T00:00:00", 2) == [
        "2032-02-29T00:00:00.000Z",
        "2060-02-29T00:00:00.000Z",
    ]


# --- macros and normalisation ---------------------------------------------------------


@pytest.mark.parametrize(
    ("macro", "expanded"),
    [
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@midnight", "0 0 * * *"),
    ],
)
def test_vixie_macros_normalise_to_five_fields(macro: str, expanded: str) -> None:
    assert parse_cron(macro).expr == expanded


def test_expression_is_normalised_to_lowercase_single_spaces() -> None:
    spec = parse_cron("  0\t9  * JAN  Mon-Fri ")
    assert spec.expr == "0 9 * jan mon-fri"
    assert spec == parse_cron("0 9 * jan mon-fri")
    assert isinstance(spec, CronSpec)


# --- due_slots -------------------------------------------------------------------------


def test_catch_up_1_fires_only_the_latest_missed_slot() -> None:
    now = at("2025-03-10T12:30:00")
    assert due_slots(parse_cron("0 * * * *"), now - 3 * HOUR_MS, now, 1) == [
        at("2025-03-10T12:00:00")
    ]


def test_catch_up_defaults_to_only_the_latest_slot() -> None:
    now = at("2025-03-10T12:30:00")
    assert due_slots(parse_cron("0 * * * *"), now - 3 * HOUR_MS, now) == [at("2025-03-10T12:00:00")]


def test_catch_up_2_fires_the_latest_two_in_ascending_order() -> None:
    now = at("2025-03-10T12:30:00")
    assert due_slots(parse_cron("0 * * * *"), now - 3 * HOUR_MS, now, 2) == [
        at("2025-03-10T11:00:00"),
        at("2025-03-10T12:00:00"),
    ]


def test_catch_up_larger_than_the_missed_slots_fires_them_all() -> None:
    now = at("2025-03-10T12:30:00")
    assert due_slots(parse_cron("0 * * * *"), now - 3 * HOUR_MS, now, 10) == [
        at("2025-03-10T10:00:00"),
        at("2025-03-10T11:00:00"),
        at("2025-03-10T12:00:00"),
    ]


def test_a_checkpoint_years_old_is_caught_up_in_bounded_time() -> None:
    now = at("2025-03-10T12:30:17")
    started = time.perf_counter()
    slots = due_slots(parse_cron("* * * * *"), at("2015-01-01T00:00:00"), now, 3)
    assert time.perf_counter() - started < 1.0
    assert slots == [
        at("2025-03-10T12:28:00"),
        at("2025-03-10T12:29:00"),
        at("2025-03-10T12:30:00"),
    ]


def test_nothing_is_due_between_slots() -> None:
    now = at("2025-03-10T12:59:00")
    assert due_slots(parse_cron("0 * * * *"), at("2025-03-10T12:00:00"), now, 5) == []


def test_nothing_is_due_when_now_is_not_after_the_checkpoint() -> None:
    now = at("2025-03-10T12:00:00")
    assert due_slots(parse_cron("* * * * *"), now, now, 5) == []


def test_a_slot_exactly_at_now_is_due() -> None:
    now = at("2025-03-10T12:00:00")
    assert due_slots(parse_cron("0 * * * *"), now - 1, now) == [now]


def test_a_slot_exactly_at_the_checkpoint_is_not_due_again() -> None:
    checkpoint = at("2025-03-10T12:00:00")
    assert due_slots(parse_cron("0 * * * *"), checkpoint, checkpoint + HOUR_MS - 1) == []


def test_due_slots_merges_both_sides_of_a_day_or() -> None:
    # 2025-06-06 and 2025-06-13 are Fridays; the 13th is also named by day of month.
    slots = due_slots(
        parse_cron("0 0 13 * 5"), at("2025-06-01T00:00:00"), at("2025-06-30T00:00:00"), 10
    )
    assert [iso(s)[:10] for s in slots] == ["2025-06-06", "2025-06-13", "2025-06-20", "2025-06-27"]


def test_catch_up_below_1_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        due_slots(parse_cron("* * * * *"), 0, HOUR_MS, 0)
    assert caught.value.code == "invalid_catch_up"


# --- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 30 2 *",  # 30 February never exists
        "0 0 31 4,6,9,11 *",  # no 31st in 30-day months
        "0 0 30 2 */7",  # a starred day of week intersects, still never
        "61 * * * *",  # minute out of range
        "60 * * * *",
        "* 24 * * *",  # hour out of range
        "0 0 0 * *",  # day of month 0
        "0 0 32 * *",
        "0 0 * 13 *",  # month 13
        "0 0 * * 8",  # day of week 8
        "* * * *",  # 4 fields
        "* * * * * *",  # 6 fields (seconds form)
        "0 0 * * * 2025",  # 6 fields (year form)
        "abc",
        "",
        "   ",
        "@reboot",
        "@every_5m",
        "5/10 * * * *",  # a step needs a range or '*'
        "*/0 * * * *",
        "10-5 * * * *",  # backwards range
        "0 0 L * *",  # croniter extensions are not cron
        "0 0 ? * *",
        "0 0 * * 1#2",
        "H * * * *",
        "0 0 * foo *",
        "0 0 * * mon-",
        "0 0 * * ,",
        "0 0 1 * jan",  # a month name in day of week
        "0 " * 200,
    ],
)
def test_invalid_expressions_are_refused_quickly_with_invalid_cron(expr: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidInput) as caught:
        parse_cron(expr)
    assert time.perf_counter() - started < 0.5
    assert caught.value.code == "invalid_cron"
    assert caught.value.extra == {"field": "cron"}
    assert caught.value.message


def test_29_february_is_accepted() -> None:
    assert parse_cron("0 0 29 2 *").expr == "0 0 29 2 *"


def test_the_refusal_names_the_field_at_fault() -> None:
    with pytest.raises(InvalidInput, match="minute"):
        parse_cron("61 * * * *")


@pytest.mark.parametrize("expr", [
    "<script>a * * * *", "* * \u2028x * *", "@<b>secret-macro", "9" * 150 + " * * * *",
    "1-<img> * * * *"])
def test_a_refusal_shows_a_bounded_excerpt_in_crons_own_characters_only(expr: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_cron(expr)
    excerpt = re.search(r"'([^']*)'", caught.value.message)
    assert excerpt is not None, caught.value.message
    assert len(excerpt[1]) <= 12
    assert re.fullmatch(r"[a-z0-9*,/@?-]*", excerpt[1]), caught.value.message
    assert len(caught.value.message) < 100


# --- properties against croniter in Vixie mode ----------------------------------------

_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


@st.composite
def field_items(draw: st.DrawFn, index: int) -> str:
    lo, hi = _RANGES[index]
    kind = draw(st.sampled_from(["*", "*/n", "a", "a-b", "a-b/n"]))
    step = draw(st.integers(1, hi - lo + 2))
    # a < b: croniter 7.0 reads a one-value range `a-a` as `*`, so it cannot judge those.
    a = draw(st.integers(lo, hi - 1))
    b = draw(st.integers(a + 1, hi))
    return {
        "*": "*",
        "*/n": f"*/{step}",
        "a": f"{a}",
        "a-b": f"{a}-{b}",
        "a-b/n": f"{a}-{b}/{step}",
    }[kind]


@st.composite
def expressions(draw: st.DrawFn) -> str:
    fields = []
    for index in range(5):
        items = draw(st.lists(field_items(index), min_size=1, max_size=3))
        # Vixie looks only at a field's first character; croniter also collapses a later
        # `*` item, so starred items go first to keep croniter a faithful oracle.
        items.sort(key=lambda item: not item.startswith("*"))
        fields.append(",".join(items))
    return " ".join(fields)


def vixie_walk(expr: str, start_ms: int, backwards: bool) -> Callable[[], datetime]:
    # croniter's implement_cron_bug reproduces Vixie's '*'-prefix rule exactly.
    start = datetime.fromtimestamp(start_ms // 1000, UTC)
    it = croniter(expr, start, ret_type=datetime, implement_cron_bug=True)
    return it.get_prev if backwards else it.get_next


_TIMES = st.integers(at("2000-01-01T00:00:00"), at("2090-01-01T00:00:00"))


@settings(max_examples=300, deadline=None)
@given(
    expr=expressions(),
    now=_TIMES,
    lookback=st.integers(0, 400 * 24 * 60 * 60_000),
    catch_up=st.integers(1, 6),
)
def test_due_slots_are_the_latest_vixie_slots_in_the_window(
    expr: str, now: int, lookback: int, catch_up: int
) -> None:
    try:
        spec = parse_cron(expr)
    except InvalidInput:
        return  # never-firing refusal is checked by its own property
    checkpoint = now - lookback
    slots = due_slots(spec, checkpoint, now, catch_up)

    assert len(slots) <= catch_up
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert all(checkpoint < s <= now and matches(spec, s) for s in slots)
    step = vixie_walk(expr, now - now % 60_000 + 60_000, backwards=True)
    expected: list[int] = []
    while len(expected) < catch_up:
        slot = int(step().timestamp()) * 1000
        if slot <= checkpoint:
            break
        expected.insert(0, slot)
    assert slots == expected


@settings(max_examples=300, deadline=None)
@given(expr=expressions(), after=_TIMES)
def test_next_slot_is_the_next_vixie_slot(expr: str, after: int) -> None:
    try:
        spec = parse_cron(expr)
    except InvalidInput:
        return
    slot = next_slot(spec, after)
    assert slot > after and matches(spec, slot)
    assert slot == int(vixie_walk(expr, after, backwards=False)().timestamp()) * 1000


@settings(max_examples=300, deadline=None)
@given(
    month=st.sampled_from(["2", "4,6", "2,4", "9,11", "*"]),
    dom=st.sampled_from(["29", "30", "31", "30,31", "*/30", "28-31/2", "1"]),
    dow=st.sampled_from(["*", "*/2", "5"]),
    after=_TIMES,
)
def test_refused_exactly_when_vixie_cron_never_fires(
    month: str, dom: str, dow: str, after: int
) -> None:
    expr = f"0 0 {dom} {month} {dow}"
    try:
        vixie_walk(expr, after, backwards=False)()
        fires = True
    except CroniterBadDateError:
        fires = False
    try:
        parse_cron(expr)
        accepted = True
    except InvalidInput:
        accepted = False
    assert accepted == fires
