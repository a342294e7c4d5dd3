"""A grader's values as numbers: a value counts only when the whole cell (or JSON string) is a number.

Accepted, per number of a cell (a cell may hold several, one per metric: `64.92 (0.87) 75.57 (0.50)`): a sign
(`-`, `+` or U+2212, the minus sign), digits with an optional decimal point, an optional exponent (`1e-3`), then
optionally a spread (`± 0.02`, `+/- 0.02`, `(0.87)`) and a `%` (read as a percentage). A placeholder (`--`, `—`,
`n/a`) stands for a number the grader did not have. Anything else (`failed on seed 2`, `~71`, `71.3†`) refuses
the whole cell: a cell that is not entirely numbers is not a value, rather than the first digits found in it.

Commas: `1,234.5` is a thousands separator; `0,7130` is a decimal comma, read only where the task's own values
use them (`NumberStyle`), and `1,234` (either) only where the task's values say which. Never 7130.

Units: a percentage against a subtask whose baseline and SOTA are fractions is divided by 100; a number without a
unit that only makes sense on the other scale (`71.3` against a SOTA of 0.842, `0.713` in a column the task writes
in `%`) is refused with what to write instead (`in_task_units`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkube.task_card import Direction, Subtask

_MINUS = "\u2212"
_NUMBER = rf"[+\-{_MINUS}]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+\-{_MINUS}]?\d+)?"
_SPREAD = rf"(?:\s*(?:±|\+/-|\+-)\s*{_NUMBER}\s*(?P<spread_unit>%)?|\s*\(\s*{_NUMBER}\s*%?\s*\))"
_ENTRY = re.compile(rf"(?P<value>{_NUMBER})(?:\s*(?P<unit>%))?{_SPREAD}?(?:\s*(?P<trailing_unit>%))?")
_PLACEHOLDER = re.compile(r"(?:-{1,3}|[\u2013\u2014]|n/?a|tbd|none|null|\?)", re.IGNORECASE)
_EMPHASIS = re.compile(r"\*\*|__|`")
_COMMA_NUMBER = re.compile(r"(?<![\d.,])\d+(?:,\d+)+(?:\.\d+)?(?![\d,])")
_THOUSANDS = re.compile(r"[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA = re.compile(r"\d+,\d+")

# A fraction of SOTA outside this range is a unit or scale mistake far more often than a result: shown, flagged,
# never averaged (`labkube.tasks.scoring.plausibility_flag`).
PLAUSIBLE_FRACTION_OF_SOTA = (0.0, 10.0)


class NotANumber(ValueError):
    """A cell or JSON value that is not a number labkube reads; the message says what it held and why not."""


@dataclass(frozen=True)
class Number:
    value: float
    percent: bool  # written with a `%`


@dataclass(frozen=True)
class NumberStyle:
    """How a task writes its own numbers: with decimal commas (`0,71`), or commas between thousands (`1,234`)."""

    decimal_comma: bool = False
    thousands_comma: bool = False


def style_of(cells: list[str]) -> NumberStyle:
    """The style of a task's own values (its listed methods' cells): decimal commas or thousands separators when
    its cells show one and not the other."""
    decimal = thousands = False
    for cell in cells:
        for token in _COMMA_NUMBER.findall(cell):
            if _THOUSANDS.fullmatch(token) and ("." in token or not _DECIMAL_COMMA.fullmatch(token)):
                thousands = True
            elif _DECIMAL_COMMA.fullmatch(token) and not _THOUSANDS.fullmatch(token):
                decimal = True
    return NumberStyle(decimal_comma=decimal and not thousands, thousands_comma=thousands and not decimal)


def _uncomma(text: str, style: NumberStyle) -> str:
    """`text` with each number's commas resolved by `style`; NotANumber for a comma it cannot read."""

    def resolve(match: re.Match[str]) -> str:
        token = match.group()
        thousands_shaped = _THOUSANDS.fullmatch(token) is not None
        decimal_shaped = _DECIMAL_COMMA.fullmatch(token) is not None
        if thousands_shaped and ("." in token or style.thousands_comma):
            return token.replace(",", "")
        if decimal_shaped and style.decimal_comma:
            return token.replace(",", ".")
        if thousands_shaped and decimal_shaped:
            raise NotANumber(
                f"`{token}` has a comma that may separate thousands or decimals, and the task's own values do not "
                "say which"
            )
        if decimal_shaped:
            raise NotANumber(f"`{token}` has a decimal comma, and the task's own values do not use them")
        raise NotANumber(f"`{token}` has commas labkube does not read")

    return _COMMA_NUMBER.sub(resolve, text)


def shown(text: str, limit: int = 80) -> str:
    """A value as messages quote it: one line, cut when long."""
    one_line = " ".join(text.split())
    return f"`{one_line[:limit]}{'…' if len(one_line) > limit else ''}`"


def read_numbers(text: str, style: NumberStyle = NumberStyle()) -> list[Number | None]:
    """The numbers of a cell in order (None for a placeholder: `-- --` is two numbers the grader did not have).
    NotANumber when anything in it is not a number in an accepted form."""
    body = _EMPHASIS.sub("", text).strip()
    if not body:
        return [None]
    body = _uncomma(body, style)
    numbers: list[Number | None] = []
    pos = 0
    while pos < len(body):
        placeholder = _PLACEHOLDER.match(body, pos)
        entry = _ENTRY.match(body, pos)
        if entry is not None:
            value = float(entry.group("value").replace(_MINUS, "-"))
            unit = bool(entry.group("unit") or entry.group("spread_unit") or entry.group("trailing_unit"))
            numbers.append(Number(value, unit))
            pos = entry.end()
        elif placeholder is not None:
            numbers.append(None)
            pos = placeholder.end()
        else:
            raise NotANumber(f"it held {shown(text)}, which is not a number")
        if pos < len(body) and not body[pos].isspace():
            raise NotANumber(f"it held {shown(text)}, which is not a number")
        while pos < len(body) and body[pos].isspace():
            pos += 1
    return numbers


def read_number(value: object, style: NumberStyle = NumberStyle()) -> Number | None:
    """One value of a JSON summary: a JSON number, or a string holding exactly one number (`"0.71 ± 0.02"`,
    `"71.3%"`); None for null or a placeholder string. NotANumber for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise NotANumber(f"it held {str(value).lower()}, which is not a number")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise NotANumber(f"it held {value}, which is not a finite number")
        return Number(float(value), percent=False)
    if not isinstance(value, str):
        raise NotANumber(f"it held a JSON {type(value).__name__}, not a number")
    numbers = read_numbers(value, style)
    if len(numbers) > 1:
        raise NotANumber(f"it held {shown(value)}: {len(numbers)} numbers where one was expected")
    return numbers[0]


def column_writes_percent(header: str, cells: list[str]) -> bool:
    """Whether a task writes a column's values as percentages: its header says `%` or its own values carry one."""
    return "%" in header or any("%" in cell for cell in cells)


def in_task_units(number: Number, subtask: Subtask, percent_column: bool) -> float:
    """`number` on the scale of the task's own values (its baseline and SOTA).

    A `%` against a subtask whose known baseline and SOTA are fractions (|x| <= 1, and the task writes no `%`) is
    divided by 100; against any other, it is the number as written (a percentage on a percentage scale). Without a
    unit, a number is taken as written unless it only makes sense on the other scale: NotANumber then, saying what
    to write."""
    known = [v for v in (subtask.baseline, subtask.sota) if v is not None]
    fractions = bool(known) and not percent_column and all(abs(v) <= 1 for v in known)
    value = number.value
    if number.percent:
        if fractions:
            return value / 100
        if not known and not percent_column:
            raise NotANumber(
                f"it held {value:g}%, and the task gives no baseline or SOTA for subtask {subtask.id} to tell whether "
                "its values are fractions or percentages (labkube.yaml: set its baseline or sota)"
            )
        return value
    scale = ", ".join(
        f"{name} {v:g}" for name, v in (("baseline", subtask.baseline), ("SOTA", subtask.sota)) if v is not None
    )
    if percent_column and 0 < abs(value) <= 1 and known and all(abs(v) > 1 for v in known):
        raise NotANumber(
            f"it held {value:g} with no unit, where the task writes this column in percent ({scale}): as a "
            f"percentage that is {value:g}%; if it is a fraction, write {value * 100:g} or {value * 100:g}%"
        )
    if fractions and subtask.direction is Direction.higher and subtask.sota and 1 < abs(value) <= 100:
        low, high = PLAUSIBLE_FRACTION_OF_SOTA
        as_fraction, as_percentage = value / subtask.sota, value / 100 / subtask.sota
        if not low <= as_fraction <= high and low <= as_percentage <= high:
            raise NotANumber(
                f"it held {value:g} with no unit, where the task's values are fractions ({scale}): that is "
                f"{as_fraction:.1f}x SOTA; if it is a percentage, write {value:g}%"
            )
    return value
