"""Exception hierarchy shared by every evoharness package.

One root, :class:`EvoharnessError`, with two branches: :class:`ConfigError` for misuse and
configuration (raised at construction, the caller must change something) and
:class:`RunError` for run-time failures. Control-flow signals are not errors.
"""

from __future__ import annotations


class EvoharnessError(Exception):
    """Root of every exception raised by evoharness.

    Every subclass pickles with its attributes (exceptions cross process and Ray boundaries):
    :meth:`__reduce__` rebuilds the exception from its message and instance attributes, so a
    subclass whose ``__init__`` takes keyword-only arguments needs no code of its own.
    """

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[EvoharnessError], args: tuple[object, ...], state: dict[str, object]
) -> EvoharnessError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class RunError(EvoharnessError, RuntimeError):
    """A failure while running (a hook, a judge, a backend): the input was valid, the work
    failed. Carries structured attributes; never raised for misuse."""


class ConfigError(EvoharnessError, ValueError):
    """Invalid configuration or API misuse, raised at construction time.

    Attributes:
        field: The option that is wrong, when one option is to blame.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency group is not installed.

    Attributes:
        extra: The extra to install (``redis``, ``langfuse``, ``train``, ...).
        module: The module that failed to import.
    """

    def __init__(self, *, extra: str, module: str, feature: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{feature} needs the optional dependency {module!r}, which is not installed. "
            f"Install it with: pip install 'evoharness[{extra}]'",
            field=None,
        )


class HookError(RunError):
    """A hook failed and the configured policy says the run must fail.

    Attributes:
        point: The hook point (``pre_tool_call``, ...).
        hook: The hook's registered name.
    """

    def __init__(self, message: str, *, point: str, hook: str) -> None:
        super().__init__(message)
        self.point = point
        self.hook = hook
