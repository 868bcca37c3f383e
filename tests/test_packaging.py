"""What a plain (non-editable) install ships: every package of the tree and the grid files that
``hybrid-lightning demo`` needs."""

import subprocess
import sys
import tomllib
import zipfile

from conftest import REPO


def test_pyproject_lists_every_package_of_the_tree():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(REPO).parts) for root in ("hybrid_lightning", "analysis")
            for p in (REPO / root).rglob("__init__.py")}
    assert listed == tree | {"hybrid_lightning.ablations"}


def test_a_built_wheel_runs_the_demo_grid_without_the_source_tree(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("hybrid_lightning-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "hybrid_lightning" / "ablations" / "demo.yaml").is_file()
    code = ("from hybrid_lightning.cli import demo_grid; from hybrid_lightning.grid import load_grid; "
            "g = load_grid(demo_grid()); print(demo_grid().parent.parent.name, len(g.cells), g.root)")
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                       cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["hybrid_lightning", "10", str(work / "runs" / "demo")]
