"""Process-wide settings that make async agents with middleware cheaper.

``create_agent`` wraps every middleware ``wrap_*`` hook in ``langsmith.traceable``. On the
async path that wrapper hands its bookkeeping to a worker thread twice per call
(``run_in_executor``), even when LangSmith tracing is off and the bookkeeping does nothing.
On the zero-latency overhead benchmark a single pass-through middleware then costs 1.38×
under ``ainvoke`` (1.06× under ``invoke``).

:func:`inline_untraced_bookkeeping` installs LangSmith's documented runtime override so the
bookkeeping runs inline whenever tracing is off, and in the worker thread as before when it
is on. It is process-wide (LangSmith has one setting), so the SDK never installs it on its
own; the ``evoharness`` CLI does, for the processes it owns.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import langsmith

DefaultAioToThread = Callable[..., Awaitable[Any]]


async def run_inline_when_untraced(
    default: DefaultAioToThread,
    ctx: contextvars.Context,
    func: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """LangSmith ``aio_to_thread`` override: inline when tracing is off, else the default."""
    # imported here: langsmith.utils costs 0.3 s of CPU that every CLI start would pay
    from langsmith.utils import tracing_is_enabled

    if tracing_is_enabled():
        return await default(ctx, func, *args, **kwargs)
    return ctx.run(func, *args, **kwargs)


def inline_untraced_bookkeeping(enabled: bool = True) -> None:
    """Install (or, with ``enabled=False``, remove) :func:`run_inline_when_untraced`.

    Call once at startup of an async service. Measured on ``evoharness bench overhead``'s
    loop under ``ainvoke``: one pass-through middleware 1.38× → 1.11×, the full harness
    1.37× → 1.14× (``docs/harness.md``).
    """
    langsmith.set_runtime_overrides(aio_to_thread=run_inline_when_untraced if enabled else None)
