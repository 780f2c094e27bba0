"""Per-platform fault injection for ``item_search`` (simulated failures, timeouts, bulk)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PlatformFaults(BaseModel):
    """Fault rates for one platform's search backend. All faults are simulated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    failure_rate: float = Field(0.0, ge=0.0, le=1.0, description="Share of calls that raise")
    timeout_rate: float = Field(0.0, ge=0.0, le=1.0, description="Share of calls that time out")
    timeout_s: float = Field(0.05, ge=0.0, description="Simulated wait before a timeout raises")
    latency_s: float = Field(0.0, ge=0.0, description="Added latency on every call")
    oversized_rate: float = Field(0.0, ge=0.0, le=1.0, description="Share of bulky results")
    oversized_items: int = Field(150, ge=1, description="Listings in an oversized result")


class FaultConfig(BaseModel):
    """Fault settings for every platform; platforms not listed behave perfectly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    platforms: dict[str, PlatformFaults] = Field(default_factory=dict)

    def for_platform(self, platform: str) -> PlatformFaults:
        """The faults of ``platform`` (none when it is not configured)."""
        return self.platforms.get(platform, PlatformFaults())

    @classmethod
    def none(cls) -> FaultConfig:
        """No faults anywhere."""
        return cls()

    @classmethod
    def demo(cls) -> FaultConfig:
        """The demo's faults: shopee is down, aliexpress times out, ebay sends bulky pages."""
        return cls(
            platforms={
                "shopee": PlatformFaults(failure_rate=1.0),
                "aliexpress": PlatformFaults(timeout_rate=0.3, timeout_s=0.02),
                "ebay": PlatformFaults(oversized_rate=0.5),
            }
        )
