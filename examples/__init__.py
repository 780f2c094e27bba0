"""Runnable example environments; ``shop`` drives the demo and the tests."""
