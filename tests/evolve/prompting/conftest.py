"""Put this folder on ``sys.path`` so ``prompt_world:environment`` resolves (also in the
subprocess of the kill test, which gets it through ``PYTHONPATH``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.append(HERE)
