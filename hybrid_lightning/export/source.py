"""The model source an exported folder carries: the package's own plain-torch model files, copied
flat beside the ``transformers`` wrapper with their package imports made relative, so that the
folder runs with ``transformers`` and ``torch`` alone and computes exactly what the package does.

The model code takes plain frozen options (``hybrid_lightning/kinds/``), which the folder rebuilds from
config.json, so the files are copied as they are: a copied file imports only other copied files.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

PACKAGE = "hybrid_lightning"
CONFIG_MODULE = "configuration_hybrid_lightning"  # the folder's config module (export/remote/)

# The package modules the model is made of, each copied as ``flat_name(module) + ".py"``.
COPIED = (
    "hybrid_lightning.kinds",
    "hybrid_lightning.kinds.base",
    "hybrid_lightning.kinds.attention",
    "hybrid_lightning.kinds.mamba2",
    "hybrid_lightning.kinds.gated_deltanet",
    "hybrid_lightning.kinds.lightning",
    "hybrid_lightning.interpreter",
    "hybrid_lightning.model.transformer",
    "hybrid_lightning.model.rope",
    "hybrid_lightning.model.attention",
    "hybrid_lightning.model.blocked",
    "hybrid_lightning.model.documents",
    "hybrid_lightning.model.init",
    "hybrid_lightning.model.mixers",
    "hybrid_lightning.model.mixers.attention",
    "hybrid_lightning.model.mixers.gated_deltanet",
    "hybrid_lightning.model.mixers.lightning",
    "hybrid_lightning.model.mixers.mamba2",
    "hybrid_lightning.model.mixers.recurrent",
    "hybrid_lightning.model.ops",
    "hybrid_lightning.model.ops.common",
    "hybrid_lightning.model.ops.delta_rule",
    "hybrid_lightning.model.ops.gated_linear",
    "hybrid_lightning.model.ops.short_conv",
)
# The wrapper, written for the folder (export/remote/).
REMOTE_FILES = (CONFIG_MODULE + ".py", "modeling_hybrid_lightning.py")

_IMPORT = re.compile(rf"^(\s*)(from|import)\s+({PACKAGE}(?:\.\w+)*)", re.MULTILINE)


def flat_name(module: str) -> str:
    """``hybrid_lightning.model.mixers.attention`` -> ``hl_mixers_attention`` (transformers loads remote
    code from one flat folder: relative imports of sibling files only)."""
    return "hl_" + module.removeprefix(PACKAGE + ".").removeprefix("model.").replace(".", "_")


def relative_source(module: str) -> str:
    """The source of ``module`` with every import of the package turned into a relative import of the
    folder's copy of that module."""
    text = Path(importlib.util.find_spec(module).origin).read_text()

    def relative(m: re.Match) -> str:
        indent, keyword, target = m.groups()
        if keyword == "import":
            raise RuntimeError(f"{module}: 'import {target}' cannot be exported; use 'from {target} import ...'")
        if target not in COPIED:
            raise RuntimeError(f"{module} imports {target}, which the export does not carry: add it to COPIED")
        return f"{indent}from .{flat_name(target)}"

    return _IMPORT.sub(relative, text)


def write_model_source(out: Path) -> list[str]:
    """Writes the copied model files and the wrapper (export/remote/) into ``out``; returns their names."""
    names = []
    for module in COPIED:
        name = flat_name(module) + ".py"
        (out / name).write_text(relative_source(module))
        names.append(name)
    for name in REMOTE_FILES:
        (out / name).write_text((Path(__file__).parent / "remote" / name).read_text())
        names.append(name)
    return names
