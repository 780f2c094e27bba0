"""Benchmarks runnable from the CLI (``evoharness bench ...``); ``bench/`` holds wrappers."""
