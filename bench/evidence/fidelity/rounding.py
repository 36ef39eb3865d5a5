"""How a fidelity figure is written down: rounded, or None where it could not be measured (never NaN or inf)."""

from __future__ import annotations

import math


def _r(x, nd=3):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), nd)
