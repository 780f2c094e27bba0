"""BFCL (the Berkeley Function Calling Leaderboard) as an environment plugin.

``pip install 'evoharness[bfcl]'`` (``bfcl-eval``); see ``docs/bfcl.md``.
"""
