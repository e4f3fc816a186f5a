"""Turning parameter metadata into form fields and form values back into overrides.

Plain functions, no Gradio here: the Gradio app and the Jupyter dashboard
both build their forms from :func:`form_fields` and parse what the user typed
with :func:`parse_form`.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from workbench.params import ParamInfo, Range, validate_overrides
from workbench.registry import close_names

__all__ = ["FormField", "form_fields", "parse_form", "param_rows", "FIELD_INT_MAX", "FIELD_INT_LIMIT",
           "pop_up_text", "field_text", "read_whole", "shown_whole"]

#: The largest whole number a number field carries exactly. Its value is a JavaScript double in the
#: browser (and in Jupyter's widgets), which holds every integer up to 2**53 - 1 and rounds larger
#: ones: 9007199254740993 arrives as 9007199254740992, 2**63 - 1 as 2**63. A whole-number field
#: takes values within +-FIELD_INT_MAX (seeds: [0, FIELD_INT_MAX]); the Python API takes what the
#: parameter's range allows.
FIELD_INT_MAX = 2**53 - 1
#: Why a field's whole numbers stop at FIELD_INT_MAX, for messages.
FIELD_INT_LIMIT = (f"2**53 - 1 = {FIELD_INT_MAX} is the largest whole number a browser number field "
                   "carries exactly (larger ones arrive rounded)")
#: Markdown's bold: ``**`` opening after a space (not inside a word, as in 2**53), closing before one.
_BOLD = re.compile(r"(?<![\w*])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w*])")


def pop_up_text(message: str) -> str:
    """A Markdown message as a pop-up shows it (plain text): its bold taken off (``**Could not start:**``),
    a ``**`` that bolds nothing kept (``2**53 - 1``, where taking every ``**`` off left ``253 - 1``)."""
    return _BOLD.sub(r"\1", message)


@dataclass(frozen=True)
class FormField:
    """One editable field.

    Attributes:
        param: the parameter it edits.
        widget: 'checkbox', 'int', 'float', 'dropdown' or 'text'.
        value: the initial value shown (lists and None as text).
    """

    param: ParamInfo
    widget: str
    value: Any

    @property
    def label(self) -> str:
        return self.param.name

    @property
    def range(self) -> Range | None:
        """The values the field takes: the parameter's range; for a whole-number field, a bound
        beyond +-:data:`FIELD_INT_MAX` cut to it (an unbounded end is shown unbounded, and
        :func:`parse_form` refuses beyond FIELD_INT_MAX all the same)."""
        return _cut(self.param.range) if self.widget == "int" else self.param.range

    @property
    def info(self) -> str:
        parts = [self.param.help.rstrip(".")] if self.param.help else []
        if self.range is not None:
            parts.append(f"range {self.range}")
        if self.widget == "text" and self.param.kind == "list":
            parts.append("comma-separated numbers")
        if self.param.nullable:
            parts.append("empty for None")
        return "; ".join(parts)


def _cut(rng: Range | None, unbounded: bool = False) -> Range | None:
    """``rng`` with a finite bound beyond +-FIELD_INT_MAX cut to it (``unbounded``: an unbounded end too)."""
    if rng is None:
        return Range(-FIELD_INT_MAX, FIELD_INT_MAX) if unbounded else None
    low, high = rng.low, rng.high
    if (low is None and unbounded) or (low is not None and low < -FIELD_INT_MAX):
        low = -FIELD_INT_MAX
    if (high is None and unbounded) or (high is not None and high > FIELD_INT_MAX):
        high = FIELD_INT_MAX
    return Range(low, high)


def _number_field(p: ParamInfo) -> bool:
    """Whether :func:`form_fields` gives ``p`` a number field (not a text field)."""
    return p.kind in ("int", "float") and not p.nullable


def field_text(value: Any) -> str:
    """A value as a text field shows it: None as empty, a list as comma-separated items."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def form_fields(params: Sequence[ParamInfo]) -> list[FormField]:
    """The editable fields for a parameter list.

    Parameters whose type cannot be typed into a form (a module object, a
    dtype) are left out here; the parameter table still lists them.
    """
    fields = []
    for p in params:
        default = None if p.required else p.default
        kind = p.kind
        if kind == "choice":
            fields.append(FormField(p, "dropdown", default))
        elif kind == "bool":
            fields.append(FormField(p, "checkbox", bool(default)))
        elif kind in ("int", "float") and not p.nullable:
            fields.append(FormField(p, kind, default))
        elif kind in ("int", "float", "str", "list"):
            fields.append(FormField(p, "text", field_text(default)))
    return fields


class _Unreadable(ValueError):
    """A raw form value that is not a value of the field's type; ``reason`` says why."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


_WHOLE = "not a whole number; enter an integer such as 2"
_EMPTY = ("the field is empty, or holds a number beyond the floating-point range (such as 1e400); "
          "enter a finite number")
#: an empty text box (the notebook's boxes are text read in Python: unlike a number box, empty means empty)
_EMPTY_TEXT = "the field is empty; enter a whole number such as 2"
_BEYOND = "beyond the floating-point range; enter a finite number"
_NOT_A_NUMBER = "not a number; enter a whole number such as 2"
_NOT_FINITE = "not a finite number; enter a whole number such as 2"
_FLOAT_MAX = Decimal(sys.float_info.max)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_whole(value: Any) -> int:
    """The whole number a whole-number field holds, exactly: an int; a float or a text that is one, however
    written (``1000``, ``1e3``, ``1000.0``, ``1_000``: 1000; text read as a decimal, so ``1e20`` is 10**20, not
    the float nearest it). Every whole-number field reads its value here (the forms' fields, the run form's
    seed, steps and every, the explorer's and the model browser's boxes); each checks its own range after.

    Raises:
        ValueError: why it is none, as a clause that ends a message (``not a whole number; enter an integer
            such as 2``): empty (a number box sends None for what it cannot hold: 1e400 too; an empty text is said
            to be empty alone), not a number,
            a fraction (2.5), not finite, beyond the floating-point range.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # (not numpy's bool: no Integral)
        return int(value)
    if isinstance(value, str) and not value.strip():  # (a text box's: nothing else makes it empty)
        raise _Unreadable(_EMPTY_TEXT)
    if value is None:
        raise _Unreadable(_EMPTY)
    if isinstance(value, str):
        try:  # (written as Python writes a number, as a float field reads it; Decimal alone takes "_1", "1__0")
            float(value)
            number = Decimal(value.strip())
        except (ValueError, InvalidOperation):
            raise _Unreadable(_NOT_A_NUMBER) from None
        if not number.is_finite():
            raise _Unreadable(_NOT_FINITE)
        if abs(number) > _FLOAT_MAX:
            raise _Unreadable(_BEYOND)
        if number != number.to_integral_value():
            raise _Unreadable(_WHOLE)
        return int(number)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _Unreadable(_NOT_FINITE)
        if not float(value).is_integer():
            raise _Unreadable(_WHOLE)
        return int(value)
    raise _Unreadable(_NOT_A_NUMBER)


def shown_whole(raw: Any, whole: int) -> str:
    """``whole``, read from ``raw`` (:func:`read_whole`), as a message names it: its digits up to 20 of them
    (those of 2**63 that a browser sent for 2**63 - 1 typed, too); a longer one as it was typed (``'1e300'``, a
    number box's ``1e+300``), not in its hundreds of digits. An int given from Python is named exactly."""
    if abs(whole) < 10**20 or isinstance(raw, numbers.Integral):
        return str(whole)
    return repr(raw.strip()) if isinstance(raw, str) else repr(float(raw))


def _parse_text(text: str, integer: bool, nullable: bool) -> int | float:
    """A number typed into a text field (a field that may also be left empty), or why it is none."""
    if not text:  # (a nullable field's empty text is None, read before: this one asks for a number)
        asked = "a whole number such as 2" if integer else "a number such as 0.5"
        raise _Unreadable(f"the field is empty; enter {asked}")
    try:
        return _parse_number(text, integer)
    except _Unreadable:
        raise
    except ValueError:
        raise _Unreadable(f"not a number; enter {'a whole number such as 2' if integer else 'a number such as 0.5'}"
                          + (", or leave the field empty for None" if nullable else "")) from None


def _parse_item(text: str, integer: bool) -> int | float:
    """One item of a comma-separated list of numbers, or why it is none."""
    listed = "whole numbers" if integer else "numbers"
    try:
        return _parse_number(text, integer)
    except ValueError:  # (2.5 where whole numbers are asked for, too)
        raise _Unreadable(f"{text!r} is not one of the {listed} it lists; write {listed} separated by "
                          f"commas, such as {'32, 16' if integer else '0.5, 1'}") from None


def _parse_number(text: str, integer: bool) -> int | float:
    if not integer:
        return float(text)
    try:
        return read_whole(text)
    except _Unreadable as err:
        if err.reason == _NOT_A_NUMBER:  # (said by the caller, which knows whether the field may be empty)
            raise ValueError(text) from None
        raise


def parse_form(params: Sequence[ParamInfo], values: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Convert raw form values into checked overrides.

    Numbers arrive as floats from number widgets and as text from text
    fields; lists arrive as comma-separated text; an empty nullable field is
    ``None``. Every field given is returned, converted and validated: a
    whole-number field given 2.5 is an error naming it, never rounded. A whole number beyond
    +-:data:`FIELD_INT_MAX` in a number field is refused: the browser may have rounded it.

    Args:
        params: the parameter metadata.
        values: field name -> raw widget value.
        owner: how to name the model or experiment in messages.

    Returns:
        Validated overrides.

    Raises:
        ValueError: a value that cannot be read or is out of range.
        TypeError: a value of the wrong type.
    """
    by_name = {p.name: p for p in params}
    overrides: dict[str, Any] = {}
    for name, raw in values.items():
        p = by_name.get(name)
        if p is None:  # (a name given in code: a typo is named, never dropped)
            close = close_names(str(name), list(by_name), n=1)
            raise ValueError(f"{owner} has no parameter {name!r}" + (f"; did you mean {close[0]!r}?" if close else ".")
                             + f" Its parameters: {', '.join(by_name) or 'none'}.")
        kind = p.kind
        try:
            if isinstance(raw, str) and kind != "str" and kind != "choice":
                text = raw.strip()
                if text in ("", "None") and p.nullable:
                    value: Any = None
                elif kind == "list":  # "32, 16", or written as Python's list "[32, 16]"
                    if text.startswith("[") and text.endswith("]"):
                        text = text[1:-1]
                    value = [_parse_item(t.strip(), p.item_type is int) for t in text.split(",") if t.strip()]
                else:
                    value = _parse_text(text, kind == "int", p.nullable)
            elif kind == "int" and isinstance(raw, float):
                value = read_whole(raw)
            elif raw is None and kind in ("int", "float") and not p.nullable:
                raise _Unreadable(_EMPTY)
            else:
                value = raw
        except (ValueError, OverflowError) as err:
            reason = f": {err.reason}" if isinstance(err, _Unreadable) and err.reason else ""
            read = "" if raw is None else f", could not read {raw!r}"  # (None: an empty box, or 1e400 in it)
            raise ValueError(f"{owner}: {name} expects {p.type_name}{read}{reason}.") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}: {name} must be a finite number, got {raw!r}. Enter a finite number.")
        if kind == "int" and _number_field(p) and _is_int(value) and abs(value) > FIELD_INT_MAX:
            full = f"; from Python, {name} takes {p.range}" if p.range is not None and p.range != _cut(p.range) else ""
            raise ValueError(f"{owner}: {name} must lie in {_cut(p.range, unbounded=True)} in this form, got "
                             f"{shown_whole(raw, value)}: {FIELD_INT_LIMIT}. Enter a value in that range{full}.")
        overrides[name] = value
    return validate_overrides(params, overrides, owner)


def param_rows(params: Sequence[ParamInfo]) -> list[dict[str, str]]:
    """Rows of a parameter table: name, type, default, allowed values, help."""
    rows = []
    for p in params:
        if p.choices is not None:
            allowed = ", ".join(repr(c) for c in p.choices)
        elif p.range is not None:
            allowed = str(p.range)
            if _number_field(p) and p.kind == "int" and _cut(p.range) != p.range:
                allowed += f" (in the form: {_cut(p.range)})"
        else:
            allowed = ""
        rows.append({
            "parameter": p.name,
            "type": p.type_name,
            "default": "required" if p.required else repr(p.default),
            "allowed": allowed,
            "help": p.help,
        })
    return rows
