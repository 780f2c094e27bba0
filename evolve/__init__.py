"""Offline jobs that grade traces and improve agents (grows with the evolve issues)."""

__all__: list[str] = []
