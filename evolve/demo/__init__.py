"""The demos (a leaf: the CLI's ``evoharness demo`` imports them, product code never does).

:func:`run_demo` runs, learns and runs again on an environment's offline model (memory and
guard rules from one evolve cycle); :func:`run_prompt_demo` goes on to the prompt layer
(proposal, gates, paired evaluation, staged rollout). On the shop every number is labelled
SIMULATED: its offline model is a simulator.
"""

from evoharness.evolve.demo.cycle import DemoResult, Phase, run_demo
from evoharness.evolve.demo.prompts import (
    PromptDemoResult,
    StepNumbers,
    bad_case_packages,
    run_prompt_demo,
)

__all__ = [
    "DemoResult",
    "Phase",
    "PromptDemoResult",
    "StepNumbers",
    "bad_case_packages",
    "run_demo",
    "run_prompt_demo",
]
