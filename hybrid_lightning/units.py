"""How counts are printed in tables and reports (grid plans, analysis): one helper, no package imports."""

from __future__ import annotations


def si(n: float) -> str:
    """``n`` with three significant digits and a thousands suffix: 1234567 -> ``1.23M``, 5e9 -> ``5B``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"
