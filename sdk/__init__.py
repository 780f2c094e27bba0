"""evoharness SDK: the embedding API, the runner, the CLI and the testing kit."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.harness import ConfigError, EvoharnessError, MissingExtraError
    from evoharness.sdk.agent import EvoAgent, create_evo_agent
    from evoharness.sdk.environment import ENVIRONMENTS, Environment, Outcome, load_environment
    from evoharness.sdk.runner import RunReport, TaskResult, run_task, run_tasks

__all__ = [
    "ENVIRONMENTS",
    "ConfigError",
    "Environment",
    "EvoAgent",
    "EvoharnessError",
    "MissingExtraError",
    "Outcome",
    "RunReport",
    "TaskResult",
    "create_evo_agent",
    "load_environment",
    "run_task",
    "run_tasks",
]

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.harness": ("ConfigError", "EvoharnessError", "MissingExtraError"),
    "evoharness.sdk.agent": ("EvoAgent", "create_evo_agent"),
    "evoharness.sdk.environment": ("ENVIRONMENTS", "Environment", "Outcome", "load_environment"),
    "evoharness.sdk.runner": ("RunReport", "TaskResult", "run_task", "run_tasks"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
