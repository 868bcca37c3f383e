"""The package's import graph, read from the source with ``ast``: no cycle between modules, and no import
from a lower layer back up. The layers are folders (a root module of the package stands alone), low to high:
the root, kinds, units and fileio < config, records and the run plan's record < rundir < model < data < probes
< plan (planning: the config resolved into the run plan) < eval < heads < training (with the evaluation
callbacks, the training-time driver of eval and heads) < grid < cli, export, bench and analysis; ``analysis``
reads the run directory only (docs/run-directory.md)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("hybrid_lightning", "analysis")  # source folders; analysis/ installs as hybrid_lightning.analysis
ANALYSIS = "hybrid_lightning.analysis"
# The layers, low to high: a module imports only from its own layer and those below. Each name is a folder of the
# package (everything under it) or a module at its root; no name is a module inside a folder.
LAYERS = [
    ("hybrid_lightning", "hybrid_lightning.kinds", "hybrid_lightning.units", "hybrid_lightning.fileio"),
    ("hybrid_lightning.config", "hybrid_lightning.records", "hybrid_lightning.runplan"),
    ("hybrid_lightning.rundir",),
    ("hybrid_lightning.model",),
    ("hybrid_lightning.data",),
    ("hybrid_lightning.probes",),
    ("hybrid_lightning.plan",),
    ("hybrid_lightning.eval",),
    ("hybrid_lightning.heads",),
    ("hybrid_lightning.training",),
    ("hybrid_lightning.grid",),
    ("hybrid_lightning.cli", "hybrid_lightning.__main__", "hybrid_lightning.export", "hybrid_lightning.bench",
     "hybrid_lightning.analysis"),
]
# analysis sits beside the command line but reads the run directory only: it imports from these layers
# (and itself), never the model, data, planning, evaluation, training or grid code.
ANALYSIS_READS = 2
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # STYLE.md: no module over 400 lines, no function over 60


def layer(module: str) -> int:
    """The index in ``LAYERS`` of the most specific name covering ``module``."""
    covering = [(len(name), i) for i, names in enumerate(LAYERS) for name in names if within(module, name)]
    assert covering, f"{module} is in no layer: add it to LAYERS in tests/test_structure.py"
    return max(covering)[1]


def within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def module_name(path: Path) -> str:
    """The module's import name: ``analysis/load.py`` is ``hybrid_lightning.analysis.load``
    (pyproject.toml's package-dir)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    parts = (*ANALYSIS.split("."), *parts[1:]) if parts[0] == "analysis" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (top level, functions, ``TYPE_CHECKING``).
    ``from P import X`` is an import of ``P.X`` where that is a module, else of ``P``; a package's
    ``__init__`` counts as importing what it imports, so its re-exports lead on to their modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            if colour[nxt] == 0 and (cycle := visit(nxt)):
                return cycle
        path.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if colour[node] == 0 and (cycle := visit(node)):
            return cycle
    return None


def violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that run up the layers, or out of what analysis may read."""
    wrong = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            up = layer(target) > layer(importer)
            outside = (within(importer, ANALYSIS) and not within(target, ANALYSIS) and layer(target) > ANALYSIS_READS)
            if up or outside:
                wrong.append(f"{importer} (layer {layer(importer)}) imports {target} (layer {layer(target)})")
    return wrong


def test_the_layers_are_folders_and_root_modules():
    """No layer singles out a module inside a folder: the layering is by folder, without exceptions."""
    for name in (n for names in LAYERS for n in names):
        parts = name.split(".")
        path = REPO / ("analysis" if name == ANALYSIS else Path(*parts))
        assert len(parts) <= 2 or name == ANALYSIS, name
        assert path.is_dir() or path.with_suffix(".py").is_file(), name


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_every_kind_of_import(graph):
    """Function-local imports, relative imports, ``from package import submodule`` and re-exports count."""
    assert "hybrid_lightning.training.trainer" in graph["hybrid_lightning.training.run"]  # imported inside train()
    assert "hybrid_lightning.model.ops.common" in graph["hybrid_lightning.model.ops"]  # a re-export
    assert "hybrid_lightning.config.schema" in graph["hybrid_lightning.config.loading"]
    assert "hybrid_lightning.rundir" in graph["hybrid_lightning.analysis.load"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_from_a_lower_layer_up(graph):
    wrong = violations(graph)
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def imports_pydantic(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(within(n, "pydantic") for n in names):
            return True
    return False


def test_the_model_reads_options_not_the_config(graph):
    """No module of ``hybrid_lightning.model`` imports pydantic or the config, directly or through the
    package modules it imports (``TYPE_CHECKING`` imports included): the model reads the frozen options
    ``hybrid_lightning.plan`` resolves, and an exported folder copies the model files as they are."""
    mods = modules()

    def reaches_config(name: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen or current not in graph:
                continue
            seen.add(current)
            if within(current, "hybrid_lightning.config") or imports_pydantic(mods[current]):
                return True
            todo.extend(graph[current])
        return False

    wrong = [name for name in sorted(graph) if within(name, "hybrid_lightning.model") and reaches_config(name)]
    assert not wrong, "model modules reading the config instead of their options: " + ", ".join(wrong)
    # the check sees them
    assert reaches_config("hybrid_lightning.plan") and reaches_config("hybrid_lightning.plan.precision")


def test_the_layer_check_reports_imports_up():
    graph = {"hybrid_lightning.eval.report": {"hybrid_lightning.training.trainer", "hybrid_lightning.model"},
             "hybrid_lightning.config.schema": {"hybrid_lightning.kinds", "hybrid_lightning.data.corpus"},
             "hybrid_lightning.analysis.load": {"hybrid_lightning.rundir", "hybrid_lightning.analysis.scores",
                                                "hybrid_lightning.grid.report"},
             "hybrid_lightning.kinds": {"hybrid_lightning.model.transformer"}}
    assert violations(graph) == [
        "hybrid_lightning.analysis.load (layer 11) imports hybrid_lightning.grid.report (layer 10)",
        "hybrid_lightning.config.schema (layer 1) imports hybrid_lightning.data.corpus (layer 4)",
        "hybrid_lightning.eval.report (layer 7) imports hybrid_lightning.training.trainer (layer 9)",
        "hybrid_lightning.kinds (layer 0) imports hybrid_lightning.model.transformer (layer 3)",
    ]


def test_analysis_runs_without_the_model_or_training_code():
    """At run time too: importing analysis loads neither torch nor the model, training, grid, data or
    evaluation code (the package's root imports its API lazily)."""
    code = ("import sys, hybrid_lightning.analysis.report, hybrid_lightning.analysis.findings, "
            "hybrid_lightning.analysis.load; "
            "print(' '.join(sorted(m for m in sys.modules if m == 'torch' or m.startswith('hybrid_lightning.'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = r.stdout.split()
    assert "hybrid_lightning.rundir" in loaded
    assert not [m for m in loaded if m == "torch" or (layer(m) > ANALYSIS_READS and not within(m, ANALYSIS))], loaded


def _loaded_by(imports: str) -> list[str]:
    """The modules of the package and torch that ``imports`` (Python statements) load, in a fresh process."""
    code = (f"import sys; {imports}; "
            "print(' '.join(sorted(m for m in sys.modules if m == 'torch' or m.startswith('hybrid_lightning'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_probes_records_and_config_roles_run_without_torch():
    """Probe generation, the evaluation records and the config roles are plain Python and numpy: writing a
    probes file or reading records loads neither torch nor the model."""
    loaded = _loaded_by("import hybrid_lightning.probes.tasks, hybrid_lightning.probes.near, "
                        "hybrid_lightning.probes.files, "
                        "hybrid_lightning.records, hybrid_lightning.config.roles")
    assert "hybrid_lightning.probes.files" in loaded
    assert not [m for m in loaded if m == "torch" or within(m, "hybrid_lightning.model")], loaded


def test_the_records_are_defined_in_one_module(graph):
    """The writers of the evaluation files and analysis's loader all take the rows from hybrid_lightning.records."""
    for user in ("hybrid_lightning.eval.runner", "hybrid_lightning.heads.retrieval", "hybrid_lightning.heads.ablation",
                 "hybrid_lightning.analysis.load", "hybrid_lightning.analysis.scores"):
        assert "hybrid_lightning.records" in graph[user], user


def sizes() -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES, as 'path: what'."""
    over = []
    for path in sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(REPO)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            over.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno >= MAX_FUNCTION_LINES):
                over.append(f"{name}: {node.name}() {node.end_lineno - node.lineno + 1} lines")
    return over


def test_no_module_or_function_over_the_size_limits():
    over = sizes()
    assert not over, "over the size limits:\n" + "\n".join(over)

