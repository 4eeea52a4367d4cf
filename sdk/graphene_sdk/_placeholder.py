"""Placeholders: what a plan's recording pass gives a pipeline where a run would read a value
from outside (a record's outputs, a step's result, a command's output, a child run's output).

A placeholder is text that says where the value would come from, ``<docker.container db:
outputs.address>``, so it survives what a program does with a value it only passes on:
formatting it into a string, putting it into a later declaration's spec or a command's argv,
indexing it (``outputs["address"]``, ``.get("port")``, ``.address``, ``.split(":")[0]``: a
deeper placeholder). What needs the value itself cannot be planned and stops the plan with
``PlanUndetermined``, naming the placeholder and the line: comparing it (``==``, ``<``), its
length, iterating over it, ``in``, turning it into a number. One thing is assumed instead, and
each time user code asks, the plan notes the assumption: a placeholder is *true* (a value read
from outside is there and not empty), so ``if not outputs.get("address"): raise ...`` takes
the path of a run where it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

_SDK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class PlanStopped(BaseException):
    """Ends a plan's recording pass early; not an ``Exception``, so pipeline code that catches
    ``Exception`` cannot swallow it. ``where`` is ``file:line`` of the pipeline's code."""

    def __init__(self, message: str, *, where: str = "", placeholder: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.placeholder = placeholder


class PlanUndetermined(PlanStopped):
    """The program needs a value the plan does not know (it branches on it, counts it...)."""


# Who records the assumptions made while a plan runs (``graphene_sdk._plan`` sets it).
Assume = Callable[[str, str], None]
_assume: list[Assume] = []


def caller() -> tuple[str, int] | None:
    """(file, line) of the innermost frame outside the SDK: the pipeline's code that asked."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(_SDK_DIR):
            return filename, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _from_sdk() -> bool:
    """Whether the SDK itself (a resource library checking an argument) asks, not user code."""
    frame = sys._getframe(2)
    return os.path.abspath(frame.f_code.co_filename).startswith(_SDK_DIR)


def where_text(found: tuple[str, int] | None) -> str:
    return f"{found[0]}:{found[1]}" if found else ""


def _undetermined(value: str, what: str) -> NoReturn:
    found = caller()
    at = f" at {where_text(found)}" if found else ""
    raise PlanUndetermined(
        f"the pipeline {what} {value}{at}: a value a run reads from outside, which a plan does not know; "
        "the plan stops here (plan with inputs that avoid this branch, or see what the run does with `run start`)",
        where=where_text(found),
        placeholder=str.__str__(value),
    )


# str methods that give another string (or strings) of the value: a deeper placeholder.
_DERIVED = (
    "capitalize",
    "casefold",
    "center",
    "expandtabs",
    "ljust",
    "lower",
    "lstrip",
    "partition",
    "removeprefix",
    "removesuffix",
    "replace",
    "rjust",
    "rpartition",
    "rsplit",
    "rstrip",
    "split",
    "splitlines",
    "strip",
    "swapcase",
    "title",
    "upper",
    "zfill",
)
# str methods whose answer depends on the value: asking them is undetermined.
_ASKING = (
    "count",
    "endswith",
    "find",
    "index",
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isprintable",
    "isspace",
    "istitle",
    "isupper",
    "rfind",
    "rindex",
    "startswith",
)


def _args_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [repr(str.__str__(a)) if isinstance(a, Placeholder) else repr(a) for a in args]
    parts += [f"{k}={v!r}" for k, v in kwargs.items()]
    return ", ".join(parts)


class Placeholder(str):
    """A value a run would read from outside, as the text ``<source: path>``."""

    source: str
    path: str

    def __new__(cls, source: str, path: str) -> Placeholder:
        made = super().__new__(cls, f"<{source}: {path}>")
        made.source = source
        made.path = path
        return made

    def deeper(self, suffix: str) -> Placeholder:
        return Placeholder(self.source, self.path + suffix)

    # --- what passes a value on: a deeper placeholder -------------------------------------------

    def __getitem__(self, key: Any) -> Placeholder:
        if isinstance(key, str) and key.isidentifier():
            return self.deeper(f".{key}")
        if isinstance(key, slice):
            return self.deeper(f"[{'' if key.start is None else key.start}:{'' if key.stop is None else key.stop}]")
        return self.deeper(f"[{str.__str__(key) if isinstance(key, Placeholder) else repr(key)}]")

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.deeper(f".{name}")

    def get(self, key: Any, default: Any = None) -> Placeholder:
        """As ``dict.get``: the value under ``key`` (a deeper placeholder)."""
        return self[key]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Placeholder, (self.source, self.path))

    # --- what needs the value: the plan stops ---------------------------------------------------

    def __bool__(self) -> bool:
        if not _from_sdk() and _assume:
            _assume[-1](str.__str__(self), where_text(caller()))
        return True

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Placeholder) and str.__eq__(self, other):
            return True
        _undetermined(self, f"compares {other!r} with")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    def __lt__(self, other: object) -> bool:
        _undetermined(self, "orders")

    __le__ = __gt__ = __ge__ = __lt__

    def __len__(self) -> int:
        _undetermined(self, "asks the length of")

    def __iter__(self) -> NoReturn:
        _undetermined(self, "iterates over")

    def __contains__(self, item: object) -> bool:
        _undetermined(self, f"asks whether {item!r} is in")

    def __int__(self) -> int:
        _undetermined(self, "takes as a number")

    __float__ = __index__ = __int__

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _undetermined(self, "calls")

    def keys(self) -> NoReturn:
        _undetermined(self, "lists the keys of")

    items = values = keys


def _derived(name: str) -> Callable[..., Placeholder]:
    def method(self: Placeholder, *args: Any, **kwargs: Any) -> Placeholder:
        return self.deeper(f".{name}({_args_text(args, kwargs)})")

    method.__name__ = name
    return method


def _asking(name: str) -> Callable[..., NoReturn]:
    def method(self: Placeholder, *args: Any, **kwargs: Any) -> NoReturn:
        _undetermined(self, f"asks {name}({_args_text(args, kwargs)}) of")

    method.__name__ = name
    return method


for _name in _DERIVED:
    setattr(Placeholder, _name, _derived(_name))
for _name in _ASKING:
    setattr(Placeholder, _name, _asking(_name))


class PlaceholderBytes(bytes):
    """Bytes a run would read from outside (``get_file``, an artifact's ``read()``): the
    placeholder's text; ``decode()`` gives the placeholder back."""

    placeholder: Placeholder

    def __new__(cls, placeholder: Placeholder) -> PlaceholderBytes:
        made = super().__new__(cls, str.__str__(placeholder).encode())
        made.placeholder = placeholder
        return made

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> Placeholder:
        return self.placeholder.deeper(".decode()")

    def __len__(self) -> int:
        _undetermined(self.placeholder, "asks the length of")

    def __iter__(self) -> NoReturn:
        _undetermined(self.placeholder, "iterates over")


def assuming(record: Assume) -> Callable[[], None]:
    """Note assumptions with ``record(placeholder, where)`` until the returned function is called."""
    _assume.append(record)
    return lambda: _assume.remove(record)
