"""How counts and plain-text tables are printed (parameter tables, grid plans and status, analysis): no package
imports, and no pandas (the commands that print tables answer without it)."""

from __future__ import annotations

import math


def si(n: float) -> str:
    """``n`` with three significant digits and a thousands suffix: 1234567 -> ``1.23M``, 5e9 -> ``5B``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def figure(x: float) -> str:
    """``x`` with three significant digits, thousands separated and no exponent: 1234.5 -> ``1,230``, 12.34 ->
    ``12.3``, 0.01234 -> ``0.0123``."""
    x = float(f"{x:.3g}")
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{2 - math.floor(math.log10(abs(x)))}f}" if x else "0"


def format_table(rows: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """Columns padded to their widest cell; the columns in ``left`` left-aligned, the others right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    )
