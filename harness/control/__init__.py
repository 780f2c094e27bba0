"""Run control: loop detection, drift check, reply check and token budget tiers
(post_reflect / pre_think)."""

from evoharness.harness.control.drift_check import DriftCheckMiddleware
from evoharness.harness.control.loop_detection import LoopDetectionMiddleware, detect_loop
from evoharness.harness.control.reply_check import ReplyCheckConfig, ReplyCheckMiddleware
from evoharness.harness.control.token_budget import TokenBudgetMiddleware

__all__ = [
    "DriftCheckMiddleware",
    "LoopDetectionMiddleware",
    "ReplyCheckConfig",
    "ReplyCheckMiddleware",
    "TokenBudgetMiddleware",
    "detect_loop",
]
