"""The API table: a bad value of every argument of every public constructor and function,
refused at the call with a typed :class:`healthkit.HealthkitError` that names the argument.

Each tier's test builds a table for its package (core, healthkit_glt, healthkit_graphlearn)
with :func:`public_callables` and :func:`missing_rows`: a public callable, or an argument of
one, with no row (and no stated reason to be exempt) fails the test, so new API cannot skip
the convention.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import pytest

from healthkit import HealthkitError, InvalidArgumentError


@attrs.frozen
class Case:
    """One bad value: ``call(env)`` must raise ``error``; ``named`` (default: the argument)
    must be in the message, and is ``.argument`` of an :class:`InvalidArgumentError`."""

    call: Callable[[Any], object]
    error: type[BaseException] = InvalidArgumentError
    named: str | None = None
    label: str = ""


#: ``{"module.name": {"argument": Case or [Case, ...]}}``
Table = Mapping[str, Mapping[str, "Case | list[Case]"]]


def public_callables(modules: Iterable[Any]) -> Iterator[tuple[str, Any]]:
    """``("module.name", obj)`` for each class and function in each module's ``__all__``."""
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) or inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj


def arguments(obj: Any) -> list[str]:
    """The named parameters a caller can pass (``self``, ``*args``, ``**kwargs`` left out)."""
    target = obj.__init__ if isinstance(obj, type) else obj
    params = inspect.signature(target).parameters.values()
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in params if p.name != "self" and p.kind not in skip]


def missing_rows(
    modules: Iterable[Any],
    table: Table,
    exempt: Mapping[str, str],
    exempt_arguments: Mapping[str, str],
) -> list[str]:
    """What the table lacks: ``module.name`` without a row, ``module.name(argument)``
    without a case. ``exempt`` / ``exempt_arguments`` map such keys to the reason."""
    missing = []
    for key, obj in public_callables(modules):
        if key in exempt:
            continue
        row = table.get(key)
        if row is None:
            missing.append(key)
            continue
        for arg in arguments(obj):
            if arg not in row and f"{key}({arg})" not in exempt_arguments:
                missing.append(f"{key}({arg})")
    return missing


def cases(table: Table) -> list[Any]:
    """The table as pytest params, one per bad value, with readable ids."""
    params = []
    for key, row in table.items():
        for arg, entry in row.items():
            for i, case in enumerate(entry if isinstance(entry, list) else [entry]):
                tag = case.label or (str(i) if isinstance(entry, list) else "")
                ident = f"{key}({arg})" + (f"-{tag}" if tag else "")
                params.append(pytest.param(arg, case, id=ident))
    return params


def check(arg: str, case: Case, env: Any) -> HealthkitError:
    """Run one case: the typed error, raised by the call itself, naming the argument."""
    named = case.named or arg
    with pytest.raises(case.error) as info:
        case.call(env)
    error = info.value
    assert isinstance(error, HealthkitError), f"{type(error).__name__}: {error}"
    assert named in str(error), (named, str(error))
    if isinstance(error, InvalidArgumentError):
        assert error.argument == named, (error.argument, named)
    return error
