"""Strict option types for every harness config: ``"10"``, ``True`` and ``1000.0`` are not 10.

Pydantic's default (lax) mode turns ``"10"`` into 10, ``True`` into 1 and ``1000.0`` into
1000, so a threshold read from a YAML file or an environment variable as text, or computed as
a float, is accepted and means something else than the caller thinks (LangChain's own
middleware rejects them). Config models derive from :class:`StrictOptions`; middleware that
take options as keyword arguments check them with :func:`check_types`. Both raise
:class:`~evoharness.harness.errors.ConfigError` naming the field, its value and the type due.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from evoharness.harness.errors import ConfigError

PathOption = Annotated[Path, Field(strict=False)]
"""A path option: a ``str`` is a path too (the one lax field of a strict model)."""


def _problems(exc: ValidationError) -> tuple[str, str | None, bool]:
    """``"field: message (got 'value')"`` for each error, the first field's name, and whether
    a value had the wrong type."""
    parts = []
    wrong_type = False
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        typed = e["type"].endswith(("_type", "is_instance_of"))
        wrong_type = wrong_type or typed
        parts.append(f"{where}: {e['msg']}" + (f" (got {e['input']!r})" if typed else ""))
    first = exc.errors()[0]["loc"] if exc.errors() else ()
    return "; ".join(parts), str(first[0]) if first else None, wrong_type


def options_error(owner: str, exc: ValidationError) -> ConfigError:
    """The :class:`ConfigError` for a validation error of ``owner``'s options."""
    problems, field, wrong_type = _problems(exc)
    fix = (
        "Pass each field a value of its type (an int is not '10', True or 10.0)"
        if wrong_type
        else "Fix the value(s) named"
    )
    return ConfigError(
        f"Invalid {owner} ({problems}). {fix}; see the field descriptions of "
        f"evoharness.harness.{owner}.",
        field=field,
    )


class StrictOptions(BaseModel):
    """Base of the harness's config models: strict types, unknown fields refused, and a bad
    value raised as :class:`~evoharness.harness.errors.ConfigError` naming the field.

    A float field takes an int (``1`` is ``1.0``); nothing else is converted. A nested model
    may be given as a dict of its fields.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise options_error(type(self).__name__, exc) from None


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind, config=ConfigDict(strict=True))


def check_types(owner: str, **options: tuple[Any, Any]) -> None:
    """Check keyword options ``name=(value, type)`` strictly, as :class:`StrictOptions` does.

    Example:
        >>> check_types("Loop", same_call=("3", int))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        evoharness.harness.errors.ConfigError: Invalid Loop (same_call='3': expected int)...
    """
    for name, (value, kind) in options.items():
        try:
            _adapter(kind).validate_python(value)
        except ValidationError:
            due = getattr(kind, "__name__", None) or str(kind)
            raise ConfigError(
                f"Invalid {owner} ({name}={value!r}: expected {due}). Pass a value of that "
                "type (an int is not '10', True or 10.0).",
                field=name,
            ) from None
