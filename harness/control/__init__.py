"""Run control: loop detection, drift check, reply check and token budget tiers
(post_reflect / pre_think)."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.harness.control.drift_check": ("DriftCheckMiddleware",),
    "evoharness.harness.control.loop_detection": ("LoopDetectionMiddleware", "detect_loop"),
    "evoharness.harness.control.reply_check": ("ReplyCheckConfig", "ReplyCheckMiddleware"),
    "evoharness.harness.control.token_budget": ("TokenBudgetMiddleware",),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
