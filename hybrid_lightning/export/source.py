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

from hybrid_lightning.kinds import KINDS
from hybrid_lightning.kinds.base import PACKAGE, flat_name

CONFIG_MODULE = "configuration_hybrid_lightning"  # the folder's config module (export/remote/)
REGISTRY_MODULE = "hl_registry"  # written for the folder: imports the modules of every registered mixer

# The package modules every model is made of, each copied as ``flat_name(module) + ".py"``; each registered mixer
# adds its own (``MixerKind.sources``: its definition, its class's module, its operators).
SHARED = (
    "hybrid_lightning.kinds",
    "hybrid_lightning.kinds.base",
    "hybrid_lightning.interpreter",
    "hybrid_lightning.model.transformer",
    "hybrid_lightning.model.rope",
    "hybrid_lightning.model.attention",
    "hybrid_lightning.model.blocked",
    "hybrid_lightning.model.documents",
    "hybrid_lightning.model.init",
    "hybrid_lightning.model.mixers",
    "hybrid_lightning.model.mixers.recurrent",
    "hybrid_lightning.model.mixers.attention",
    "hybrid_lightning.model.observe",
    "hybrid_lightning.model.restrict",
    "hybrid_lightning.model.ops",
    "hybrid_lightning.model.ops.common",
    "hybrid_lightning.model.ops.short_conv",
)
# The wrapper, written for the folder (export/remote/).
REMOTE_FILES = (CONFIG_MODULE + ".py", "modeling_hybrid_lightning.py")


def copied() -> tuple[str, ...]:
    """The modules an export copies: the shared ones and those of every registered mixer."""
    return tuple(dict.fromkeys((*SHARED, *(m for k in KINDS.values() for m in k.sources))))


_IMPORT = re.compile(rf"^(\s*)(from|import)\s+({PACKAGE}(?:\.\w+)*)", re.MULTILINE)


def relative_source(module: str, carried: tuple[str, ...]) -> str:
    """The source of ``module`` with every import of the package turned into a relative import of the
    folder's copy of that module."""
    text = Path(importlib.util.find_spec(module).origin).read_text()

    def relative(m: re.Match) -> str:
        indent, keyword, target = m.groups()
        if keyword == "import":
            raise RuntimeError(f"{module}: 'import {target}' cannot be exported; use 'from {target} import ...'")
        if target not in carried:
            raise RuntimeError(f"{module} imports {target}, which the export does not carry: add it to SHARED, or to "
                               "the operators of the mixer whose module imports it")
        return f"{indent}from .{flat_name(target)}"

    return _IMPORT.sub(relative, text)


def registry_source() -> str:
    """The folder's ``hl_registry.py``: an import of each registered mixer's definition (which registers it there,
    as in the package) and class module, by name, because transformers carries into its module cache only the
    files that the wrapper's imports reach, and the model imports mixer classes by dotted name (``kinds.base.load``)."""
    modules = dict.fromkeys(m for k in KINDS.values() for m in k.sources[:2])
    lines = [f"from .{flat_name(m)} import *  # noqa: F401, F403" for m in modules]
    doc = '"""Written by hybrid-lightning export: the modules of the mixers registered when the folder was written."""'
    return doc + "\n\n" + "\n".join(lines) + "\n\nREGISTERED = True  # what the wrapper imports\n"


def write_model_source(out: Path) -> list[str]:
    """Writes the copied model files, the registry of the mixers (``registry_source``) and the wrapper
    (export/remote/) into ``out``; returns their names."""
    carried = copied()
    names = []
    for module in carried:
        name = flat_name(module) + ".py"
        (out / name).write_text(relative_source(module, carried))
        names.append(name)
    (out / (REGISTRY_MODULE + ".py")).write_text(registry_source())
    names.append(REGISTRY_MODULE + ".py")
    for name in REMOTE_FILES:
        (out / name).write_text((Path(__file__).parent / "remote" / name).read_text())
        names.append(name)
    return names
