"""evoharness SDK: the embedding API, the runner, the CLI and the testing kit."""

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
