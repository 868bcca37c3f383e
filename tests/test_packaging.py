"""What a plain (non-editable) install ships: every package of the tree (analysis/ inside the package's
namespace, as ``hybrid_lightning.analysis``), the grid files that ``hybrid-lightning demo`` needs and
the SLURM profiles."""

import subprocess
import sys
import zipfile

import tomllib

from conftest import REPO


def test_pyproject_lists_every_package_of_the_tree():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "hybrid_lightning").rglob("__init__.py")}
    tree |= {"hybrid_lightning." + ".".join(p.parent.relative_to(REPO).parts)
             for p in (REPO / "analysis").rglob("__init__.py")}
    data = {"hybrid_lightning.ablations", "hybrid_lightning.slurm"}  # folders of package data
    assert set(setuptools["packages"]) == tree | data
    assert setuptools["package-dir"] == {"hybrid_lightning.ablations": "ablations",
                                         "hybrid_lightning.analysis": "analysis", "hybrid_lightning.slurm": "slurm"}


def test_a_built_wheel_runs_the_demo_grid_without_the_source_tree(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("hybrid_lightning-*.whl"))
    site = tmp_path / "site"
    names = zipfile.ZipFile(wheel).namelist()
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "hybrid_lightning" / "ablations" / "demo.yaml").is_file()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hybrid_lightning"}, tops  # no top-level analysis (or any other) package
    shipped = {n for n in names if n.startswith(("hybrid_lightning/analysis/", "hybrid_lightning/slurm/"))}
    for source in [*(REPO / "analysis").glob("*.py"), *(REPO / "slurm").glob("*.yaml"), *(REPO / "slurm").glob("*.sh")]:
        assert f"hybrid_lightning/{source.parent.name}/{source.name}" in shipped, source.name
    code = ("from hybrid_lightning.cli import demo_grid; from hybrid_lightning.grid import load_grid; "
            "import hybrid_lightning.analysis.report; "
            "g = load_grid(demo_grid()); print(demo_grid().parent.parent.name, len(g.cells), g.root)")
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                       cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["hybrid_lightning", "10", str(work / "runs" / "demo")]
