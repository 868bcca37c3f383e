"""The commands that do not train answer without the training stack: each runs in a fresh process and the modules
it loaded are checked (the import set, not the time, which a shared machine makes noisy). ``params`` and
``grid plan`` count parameters on blocks built on the meta device and estimate memory on fake tensors, so they
load torch, but not Lightning."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from hybrid_lightning.config import load_config
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.rundir.files import write_plan
from hybrid_lightning.rundir.status import write_status

TRAINING = {"torch", "lightning", "pytorch_lightning", "torchmetrics"}
ANALYSIS = {"pandas", "matplotlib", "scipy", "tensorboard"}
PAPER = str(REPO / "ablations" / "paper.yaml")
QUICKSTART = str(REPO / "ablations" / "quickstart.yaml")
DEMO = str(REPO / "ablations" / "demo.yaml")


def loaded(*args: str, cwd=REPO) -> tuple[int, set[str], str]:
    """(exit code, the top-level modules loaded, stdout + stderr) of ``hybrid-lightning ARGS`` in a fresh process."""
    code = ("import contextlib, io, json, sys\nfrom hybrid_lightning.cli import main\nout = io.StringIO()\n"
            "try:\n    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
            "        rc = main(sys.argv[1:])\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "print(json.dumps([rc, sorted({m.split('.')[0] for m in sys.modules}), out.getvalue()]))")
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rc, modules, out = json.loads(r.stdout.splitlines()[-1])
    return rc, set(modules), out


@pytest.mark.parametrize("args, code", [
    (["--help"], 0), (["--version"], 0), (["grid", "--help"], 0), (["pack", "--help"], 0),
    (["train", QUICKSTART, "--print-config"], 0), (["analyze"], 2), (["analyze", "/absent/folder"], 2),
])
def test_commands_that_do_not_train_load_neither_torch_nor_the_analysis_stack(args, code):
    rc, modules, out = loaded(*args)
    assert rc == code, out
    assert not modules & (TRAINING | ANALYSIS), sorted(modules & (TRAINING | ANALYSIS))


def test_print_config_of_a_budget_in_tokens_per_param_counts_parameters_with_torch_only():
    rc, modules, out = loaded("train", "--set", "train.tokens_per_param=20", "--set", "train.devices=1",
                              "--print-config")
    assert rc == 0 and "max_steps:" in out and "tokens_per_param: 20" in out
    assert "torch" in modules and not modules & (TRAINING - {"torch"})


def test_grid_status_and_cancel_read_what_the_runs_recorded_without_torch(tmp_path):
    cells = ["--cells", "arch=full,size=S1,tokens_per_param=100.0,*", "--cells",
             "arch=mamba2,size=S1,tokens_per_param=1000.0,*"]
    rc, modules, out = loaded("grid", "status", PAPER, "--root", str(tmp_path), "--json")
    assert rc == 0 and not modules & (TRAINING | ANALYSIS), sorted(modules & (TRAINING | ANALYSIS))
    rows = {r["name"]: r for r in json.loads(out)}
    assert len(rows) == 360 and {r["state"] for r in rows.values()} == {"not submitted"}
    # steps of a budget in tokens_per_param: counted once planned
    assert {r["max_steps"] for r in rows.values()} == {None}
    # a cell that trained recorded its plan: its steps follow from the parameters it recorded, with no count here
    from hybrid_lightning.grid.spec import load_grid

    cell = load_grid(PAPER, tmp_path, cells=cells[3:]).cells[0]
    cell.run_dir.mkdir()
    write_plan(cell.run_dir, cell.plan)
    write_status(cell.run_dir, state="interrupted", step=40, max_steps=cell.plan.budget.max_steps)
    rc, modules, out = loaded("grid", "status", PAPER, "--root", str(tmp_path), *cells)
    assert rc == 0 and "torch" not in modules, out
    # stopped at a logged step 40 without a checkpoint: it resumes from 0, and says so
    assert f"{cell.name}  incomplete     0/{cell.plan.budget.max_steps}" in out and "0/-" in out
    assert "2 cells: 1 incomplete, 1 not submitted" in out
    rc, modules, out = loaded("grid", "cancel", PAPER, "--root", str(tmp_path))
    assert rc == 0 and "cancelled 0 cell(s)" in out and "torch" not in modules


def test_params_and_grid_plan_load_torch_but_not_lightning(tmp_path):
    for args in (["params", QUICKSTART], ["grid", "plan", PAPER, "--root", str(tmp_path), "--cells",
                                          "arch=full,size=S1,*"]):
        rc, modules, out = loaded(*args)
        assert rc == 0, out
        assert "torch" in modules and not modules & (TRAINING - {"torch"}) and not modules & ANALYSIS, args


def test_pack_loads_pandas_but_not_torch(tmp_path):
    rc, modules, out = loaded("pack", str(REPO / "analysis" / "results" / "cpu_replica" / "runs"), "--out",
                              str(tmp_path / "packed"))
    assert rc == 0 and "packed runs in" in out, out
    assert not modules & TRAINING, sorted(modules & TRAINING)


def test_the_quickstart_prints_its_config_as_train_reads_it(tmp_path):
    rc, _, out = loaded("train", QUICKSTART, "--print-config")
    (tmp_path / "printed.yaml").write_text(out)
    assert load_config(tmp_path / "printed.yaml") == plan_run(load_config(QUICKSTART))[0]


@pytest.mark.parametrize("command", [["train"], ["train", "--dry-run"], ["params"], ["data", "prepare"],
                                     ["grid", "plan", DEMO], ["grid", "submit", DEMO, "--dry-run"]])
def test_a_mistyped_key_is_refused_before_torch_in_under_a_second_of_cpu(command):
    """The config is loaded and validated (with --set) before torch or Lightning is imported: the refusal names the
    key, and the whole process, interpreter start included, takes under 1 s of CPU."""
    code = ("import json, resource, sys\nfrom hybrid_lightning.cli import main\nrc = main(sys.argv[1:])\n"
            "use = resource.getrusage(resource.RUSAGE_SELF)\n"
            f"print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in {sorted(TRAINING)!r}), "
            "use.ru_utime + use.ru_stime]))")
    r = subprocess.run([sys.executable, "-c", code, *command, "--set", "model.windw=5"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    rc, heavy, cpu = json.loads(r.stdout.splitlines()[-1])
    assert rc == 2 and "unknown config key 'model.windw'; did you mean 'model.window'?" in r.stderr, r.stderr
    assert heavy == [] and cpu < 1.0, (heavy, cpu)
