"""Schedule time logic: which minutes a cron expression names. No database, no clock.

Times are UTC epoch milliseconds passed in by the caller, so tests need no frozen clock.
Semantics are Vixie cron's, decided here rather than inherited from croniter:

* Exactly 5 fields. The macros `@yearly` `@annually` `@monthly` `@weekly` `@daily`
  `@midnight` `@hourly` are normalised to 5 fields; `@reboot`, seconds or year fields,
  and croniter's extensions (`L` `W` `#` `?` `H`) are refused, as is `N/step` (Vixie
  refuses it too).
* Day of month and day of week OR together only when neither field starts with `*`;
  otherwise a day must match both. So `0 0 */2 * 1` is "Mondays on odd days", as in
  Vixie, where croniter's default would OR them.

Our parser computes the value sets; croniter only walks the calendar, over plain number
lists with `day_or=False`, each side of an OR walked separately and merged. Its own
star heuristics (it reads `5-5` as `*`) never decide our semantics.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from core.errors import InvalidInput

MINUTE_MS = 60_000
_MAX_LENGTH = 200
# A valid expression fires at least every 40 years (29 February on a given weekday,
# across a skipped century leap year), so a 50-year walk bound never hides a real slot.
_SEARCH_YEARS = 50

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, start=1)}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, lowest, highest, names): day of week runs to 7 because 7 is Sunday, as in Vixie.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_NOT_CRON = re.compile(r"[^a-z0-9*,/@-]")  # the expression is lower-cased before parsing
_ITEM = re.compile(r"^(?:(\*)|([a-z0-9]+)(?:-([a-z0-9]+))?)(?:/([0-9]+))?$")


@dataclass(frozen=True)
class CronSpec:
    """A parsed, validated expression. `expr` is the normalised 5-field text to store.

    The sets hold the values each field allows (day of week 0-6, Sunday 0); `days_or`
    says whether day of month and day of week combine with OR (Vixie: neither field
    starts with `*`) or AND.
    """

    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_or: bool

    def __str__(self) -> str:
        return self.expr


def _refuse(message: str) -> InvalidInput:
    return InvalidInput("invalid_cron", message, extra={"field": "cron"})


def _excerpt(token: str) -> str:
    """What of a refused token a message may show: 12 characters at most, and only
    cron's own (`*` `,` `/` `-` `@`, letters, digits); any other becomes `?`."""
    return repr(_NOT_CRON.sub("?", token[:12]))


def _value(token: str, field: str, lo: int, hi: int, names: dict[str, int]) -> int:
    if token.isdigit():
        value = int(token)
    elif token in names:
        value = names[token]
    else:
        raise _refuse(f"{field}: {_excerpt(token)} is neither a number nor a known name")
    if not lo <= value <= hi:
        raise _refuse(f"{field}: {_excerpt(token)} is outside {lo}-{hi}")
    return value


def _parse_field(text: str, field: str, lo: int, hi: int, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise _refuse(f"{field}: {_excerpt(item)} is not a value, range, list or step")
        star, first, last, step_text = match.groups()
        if first is not None and last is None and step_text is not None:
            raise _refuse(f"{field}: a step needs a range or '*' before it")
        start = lo if star else _value(first, field, lo, hi, names)
        end = hi if star else _value(last, field, lo, hi, names) if last else start
        if start > end:
            raise _refuse(f"{field}: range {start}-{end} runs backwards")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise _refuse(f"{field}: step must be at least 1")
        values.update(range(start, end + 1, step))
    return values


def _dom_side_fires(days: frozenset[int], months: frozenset[int]) -> bool:
    """Whether some named day exists in some named month (29 February counts).

    Every real (month, day) falls on each weekday in some year, so existence alone
    decides whether the day fields can ever match, whatever the day of week says.
    """
    longest = {m: 29 if m == 2 else calendar.monthrange(2001, m)[1] for m in months}
    return any(day <= longest[month] for month in months for day in days)


def parse_cron(expr: str) -> CronSpec:
    """Validate and normalise; raise InvalidInput(`invalid_cron`) naming the problem.

    Refusal includes expressions that can never fire (30 February). That check is exact
    and constant-time: an AND combination fires iff some named day exists in some named
    month, and an OR combination with a real weekday restriction always fires.
    """
    if not isinstance(expr, str) or not expr.strip():
        raise _refuse("cron must be a non-empty string")
    if len(expr) > _MAX_LENGTH:
        raise _refuse(f"cron is longer than {_MAX_LENGTH} characters")
    text = expr.strip().lower()
    if text.startswith("@"):
        if text not in _MACROS:
            raise _refuse(f"{_excerpt(text)} is not supported; use a 5-field expression")
        text = _MACROS[text]
    fields = text.split()
    if len(fields) != 5:
        raise _refuse(
            f"cron needs 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    sets = [_parse_field(f, *spec) for f, spec in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    days_or = not fields[2].startswith("*") and not fields[4].startswith("*")
    days, months = frozenset(sets[2]), frozenset(sets[3])
    if not days_or and not _dom_side_fires(days, months):
        raise _refuse("cron can never fire: no month it names has the day of month it names")
    return CronSpec(
        " ".join(fields), frozenset(sets[0]), frozenset(sets[1]), days, months, weekdays, days_or
    )


def matches(spec: CronSpec, at_ms: int) -> bool:
    """Whether `at_ms` is one of the schedule's slots (slots are whole minutes)."""
    if at_ms % MINUTE_MS:
        return False
    moment = datetime.fromtimestamp(at_ms // 1000, UTC)
    dom_ok = moment.day in spec.days
    dow_ok = (moment.weekday() + 1) % 7 in spec.weekdays
    return (
        moment.minute in spec.minutes
        and moment.hour in spec.hours
        and moment.month in spec.months
        and ((dom_ok or dow_ok) if spec.days_or else (dom_ok and dow_ok))
    )


def _render(values: frozenset[int], full: range) -> str:
    return "*" if values >= set(full) else ",".join(str(v) for v in sorted(values))


@lru_cache(maxsize=1024)
def _walk_exprs(spec: CronSpec) -> tuple[str, ...]:
    """croniter expressions (each read with AND) whose union is the schedule."""
    minute, hour = _render(spec.minutes, range(60)), _render(spec.hours, range(24))
    dom, month = _render(spec.days, range(1, 32)), _render(spec.months, range(1, 13))
    dow = _render(spec.weekdays, range(7))
    if not spec.days_or:
        return (f"{minute} {hour} {dom} {month} {dow}",)
    sides = [f"{minute} {hour} * {month} {dow}"]
    if _dom_side_fires(spec.days, spec.months):  # 31 February OR Monday is just Monday
        sides.append(f"{minute} {hour} {dom} {month} *")
    return tuple(sides)


def _walk(expr: str, start_ms: int, backwards: bool) -> Iterator[int]:
    """Slots strictly after (or before) the minute-aligned `start_ms`, one by one."""
    # Imported here, not with this module: `core.settings` imports the parser, so every
    # process (a sweeper before its first claim) would load croniter and dateutil, and
    # croniter's import runs `file` on the interpreter (`platform.architecture`), while
    # only a walk needs it (issue 15).
    from croniter import CroniterBadDateError, croniter

    start = datetime.fromtimestamp(start_ms // 1000, UTC)
    it = croniter(
        expr, start, ret_type=datetime, day_or=False, max_years_between_matches=_SEARCH_YEARS
    )
    step = it.get_prev if backwards else it.get_next
    while True:
        try:
            yield int(step().timestamp()) * 1000
        except CroniterBadDateError:
            return


def next_slot(spec: CronSpec, after_ms: int) -> int:
    """The first slot strictly after `after_ms`; the walk is bounded to 50 years."""
    start = after_ms - after_ms % MINUTE_MS  # a slot after this minute is after after_ms
    found = [s for e in _walk_exprs(spec) if (s := next(_walk(e, start, False), None)) is not None]
    if not found:
        raise _refuse("cron has no slot within the search bound")
    return min(found)


def due_slots(spec: CronSpec, checkpoint_ms: int, now_ms: int, catch_up: int = 1) -> list[int]:
    """Slots s with checkpoint_ms < s <= now_ms, only the latest `catch_up`, ascending.

    Walks backwards from now and stops after `catch_up` slots or at the checkpoint, so
    the work is bounded by `catch_up` even when the checkpoint is years old.
    """
    if catch_up < 1:
        raise InvalidInput(
            "invalid_catch_up", "catch_up must be at least 1", extra={"field": "catch_up"}
        )
    if now_ms <= checkpoint_ms:
        return []
    start = now_ms - now_ms % MINUTE_MS + MINUTE_MS  # slots strictly before are <= now
    found: set[int] = set()
    for expr in _walk_exprs(spec):
        for count, slot in enumerate(_walk(expr, start, True), start=1):
            if slot <= checkpoint_ms:
                break
            found.add(slot)
            if count == catch_up:
                break
    return sorted(found)[-catch_up:]
