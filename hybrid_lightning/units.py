"""How counts and plain-text tables are printed (parameter tables, grid plans and status, analysis): no package
imports, and no pandas (the commands that print tables answer without it)."""

from __future__ import annotations


def si(n: float) -> str:
    """``n`` with three significant digits and a thousands suffix: 1234567 -> ``1.23M``, 5e9 -> ``5B``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def format_table(rows: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """Columns padded to their widest cell; the columns in ``left`` left-aligned, the others right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows
    )
