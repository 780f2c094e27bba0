"""Harness overhead benchmark; same as `evoharness bench overhead`."""

import sys

from evoharness.sdk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "overhead", *sys.argv[1:]]))
