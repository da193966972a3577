"""A setting described once, on its dataclass field: its help, flag, bounds and the front doors that take it.

ServeConfig's fields (`nanomt serve`'s flags) and Decoding's and Sampling's (a config's decode section, the flags of
`nanomt translate` and `evaluate`, the HTTP request, the CTranslate2 export) are made with `setting`; the doors are
generated from these fields (nanomt/cli/parser.py, nanomt/core/config.py, nanomt/serve/schemas.py,
nanomt/interop/ct2.py) and the value checks its bounds with `check_bounds`. Standard library only: parsing and
`--help` import no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, field

# The places a decoding setting is given: a checkpoint's config (its decode section), a command's flags, an HTTP
# request (nanomt's API), and the CTranslate2 export, which decodes with CTranslate2's options. A Decoding field
# reaches each, or says why not in `absent` (tests/core/test_settings.py holds every field to it).
DOORS = ("config", "flag", "request", "ct2")
BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def setting(
    default=MISSING,
    *,
    help: str,
    flag: str | None = None,
    metavar: str | None = None,
    read: Callable | str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple | None = None,
    cap: dict | None = None,
    absent: dict[str, str] | None = None,
    ct2: str | None = None,
    **kw,
) -> Field:
    """A field with what each front door needs to know of it.

    help: what it does, one sentence (a flag's help, a request field's description, the docs' meaning).
    flag: its flag (default --NAME; "" for a positional argument); metavar its placeholder; `read` turns the flag's
        string into the value (a callable, or "module:function" imported when a flag is read).
    ge/gt/le/lt, choices: the values it takes, checked where the value is built (check_bounds) and given to the
        request schema and the docs; `cap`: tighter bounds for a request (what a stranger may ask), e.g. {"le": 16}.
    absent: {door: why} for each of DOORS that does not take it (a Decoding field).
    ct2: the option of CTranslate2's translate_batch that takes its value as it is, "nanomt" where the export's own
        code applies it (interop/ct2.py), else it must be absent there (the export refuses a value other than its
        default).
    """
    given = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    metadata = {
        "help": help,
        "flag": flag,
        "metavar": metavar,
        "read": read,
        "bounds": {k: v for k, v in given.items() if v is not None},
        "choices": choices,
        "cap": cap or {},
        "absent": absent or {},
        "ct2": ct2,
    }
    return field(default=default, metadata=metadata, **kw)


def fields_at(cls: type, door: str) -> list[Field]:
    """The fields of a settings dataclass that `door` takes: made with `setting` and not absent there."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata and door not in f.metadata["absent"]]


def default_of(f: Field):
    """A field's default value (its factory's where it has one)."""
    return f.default if f.default is not MISSING else f.default_factory()


def reader(f: Field) -> Callable | None:
    """The function that turns a flag's string into the field's value, imported where it is named as text."""
    read = f.metadata.get("read")
    if isinstance(read, str):
        module, name = read.split(":")
        return getattr(importlib.import_module(module), name)
    return read


def bounds_text(bounds: dict) -> str:
    """Bounds as a reader writes them: ">= 0", "in (0, 1]"."""
    text = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    low = [k for k in ("ge", "gt") if k in bounds]
    high = [k for k in ("le", "lt") if k in bounds]
    if low and high:
        left, right = "[" if low[0] == "ge" else "(", "]" if high[0] == "le" else ")"
        return f"in {left}{text(bounds[low[0]])}, {text(bounds[high[0]])}{right}"
    key = (low or high)[0]
    return f"{BOUNDS[key]} {text(bounds[key])}"


def within(value, bounds: dict) -> bool:
    """Whether a number is finite and within the bounds."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    tests = {"ge": value >= bounds.get("ge", value), "gt": "gt" not in bounds or value > bounds["gt"]}
    tests |= {"le": value <= bounds.get("le", value), "lt": "lt" not in bounds or value < bounds["lt"]}
    return all(tests.values())


@functools.cache
def number_kind(cls: type, name: str) -> type | None:
    """int or float where a field of `cls` is one (or it or None), else None: what a value given in Python must be."""
    hint = typing.get_type_hints(cls)[name]
    kinds = typing.get_args(hint) or (hint,)
    return float if float in kinds else int if int in kinds else None


def check_bounds(value: object) -> None:
    """ValueError naming the first field of a settings dataclass instance outside its bounds or choices (a float
    that is not finite is outside any bounds; one without bounds must still be a number)."""
    for f in dataclasses.fields(value):
        if "help" not in f.metadata:
            continue
        v, meta = getattr(value, f.name), f.metadata
        if v is None or isinstance(v, bool):
            continue
        if meta["choices"] is not None and v not in meta["choices"]:
            raise ValueError(f"{f.name} must be one of {meta['choices']}, got {v!r}")
        kind = number_kind(type(value), f.name)
        if (kind is int and not isinstance(v, int)) or (kind is float and not isinstance(v, int | float)):
            raise ValueError(f"{f.name} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
        if not isinstance(v, int | float):
            continue
        if meta["bounds"] and not within(v, meta["bounds"]):
            raise ValueError(f"{f.name} must be {bounds_text(meta['bounds'])}, got {v}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{f.name} must be a number, got {v}")
