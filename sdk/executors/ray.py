"""A Ray executor: fan items out over a Ray cluster (or a local Ray started on demand).

``pip install 'evoharness[ray]'``. With no address, :func:`ray.init` starts a local Ray on
loopback (what the tests do); with ``address="ray://head:10001"`` or ``"auto"`` it joins a
cluster. Each item is one Ray task (``num_cpus`` each); results are gathered in input order
with :func:`ray.wait`, so progress is reported as tasks finish. A task's exception comes back
as its original type (Ray wraps it; we unwrap it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from evoharness.harness.errors import ConfigError
from evoharness.harness.extras import require_extra
from evoharness.sdk.executors.base import OnDone

T = TypeVar("T")
R = TypeVar("R")


class RayExecutor:
    """Run items as Ray tasks.

    Args:
        address: Cluster address (``auto``, ``ray://host:10001``); ``None`` starts a local Ray
            on loopback unless one is already initialised in this process.
        workers: CPUs for a local Ray started here (also the in-flight bound reported).
        num_cpus: CPUs each task reserves.
        runtime_env: Passed to :func:`ray.init` (e.g. ``{"env_vars": {...}}``).
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        workers: int = 2,
        num_cpus: float = 1.0,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}", field="workers")
        if num_cpus <= 0:
            raise ConfigError(f"num_cpus must be positive, got {num_cpus}", field="num_cpus")
        self._ray = require_extra("ray", extra="ray", feature="The Ray executor")
        self.name: str = "ray"
        self.workers = workers
        self.num_cpus = num_cpus
        self._started_here = False
        if not self._ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "ignore_reinit_error": True,
                "configure_logging": False,
            }
            if address is None:
                kwargs.update(num_cpus=workers, _node_ip_address="127.0.0.1")
            else:
                kwargs["address"] = address
            if runtime_env:
                kwargs["runtime_env"] = runtime_env
            self._ray.init(**kwargs)
            self._started_here = True

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        """``[fn(x) for x in items]`` as Ray tasks, results in input order."""
        ray = self._ray
        remote = ray.remote(num_cpus=self.num_cpus, max_retries=0)(_call)
        refs = [remote.remote(fn, item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index[ref]
                    results[i] = _unwrap(ray, ref)
                    if on_done is not None:
                        on_done(i, results[i])
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        """Shut down the local Ray this executor started (a joined cluster stays up)."""
        if self._started_here and self._ray.is_initialized():
            self._ray.shutdown()
        self._started_here = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def _unwrap(ray: Any, ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task raised: re-raise its own exception
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise
