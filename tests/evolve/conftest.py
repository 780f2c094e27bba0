"""Make the test-only environment modules of this folder importable (``calc_world``).

The suite runs with ``--import-mode=importlib``, which keeps test folders off ``sys.path``;
plugin specs such as ``calc_world:environment`` (and subprocesses given ``PYTHONPATH``)
need this folder on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.append(HERE)
