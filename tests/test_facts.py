"""Facts worked out once (issue 48, item 3): the memory estimate reads the plan, the grid reads the plan's step
budget, a cell's plan made at submission is checked where it trains, an older run's processes come from its
config (not guessed from its records), the validation sets' order is the data module's, and a scheduler's job
takes over the lock of its earlier start through the identity its executor records."""

import dataclasses
import json

import pytest

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import VAL_HELD_OUT, VAL_SYNTHETIC, VAL_TEXT, LMDataModule
from hybrid_lightning.fileio import RunLock, owner_identity, set_job_identity
from hybrid_lightning.grid.local import LocalExecutor
from hybrid_lightning.grid.spec import load_grid
from hybrid_lightning.grid.state import cell_plan_path, planned_steps, read_jobs, record_plan
from hybrid_lightning.plan.memory import estimate_memory
from hybrid_lightning.plan.resolve import check_planned, plan_run
from hybrid_lightning.rundir.evals import write_eval_record
from hybrid_lightning.rundir.files import read_plan
from hybrid_lightning.training.run import train
from test_grid import TINY_BASE, write_grid


@pytest.fixture(scope="module")
def planned():
    return plan_run(validate_config(TINY_BASE))


def test_the_memory_estimate_reads_the_plan(planned):
    """Weights, gradients and moments follow the plan's parameter count; activations its precision; the result
    is the plan's own estimate."""
    _, plan = planned
    assert estimate_memory(plan, plan.memory_estimate.checkpointing) == plan.memory_estimate
    more = dataclasses.replace(plan, params={**plan.params, "total": plan.params["total"] + 1000})
    assert estimate_memory(more, False).weights == plan.memory_estimate.weights + 4 * 1000
    assert plan.precision == "32-true"
    half = estimate_memory(dataclasses.replace(plan, precision="bf16-mixed"), False)
    assert half.activations < plan.memory_estimate.activations


def test_a_plan_that_differs_from_the_submitted_one_is_refused_naming_the_keys(tmp_path, planned):
    cfg, plan = planned
    submitted = json.loads(json.dumps(plan.as_dict()))  # as recorded: JSON
    check_planned(cfg, plan, submitted)  # the same plan
    submitted["params"]["total"] += 1
    submitted["budget"]["max_steps"] = 7
    with pytest.raises(ValueError, match=r"differs from the one made when the run was submitted \(budget.max_steps: 7 "
                                         r"when submitted, 20 here; params.total: .*another hybrid-lightning version"):
        check_planned(cfg, plan, submitted)
    with pytest.raises(ValueError, match="budget.max_steps"):  # before anything is written
        train(cfg, tmp_path / "run", planned=submitted)
    assert not (tmp_path / "run").exists()


def test_what_the_machine_resolves_is_not_compared():
    cfg, plan = plan_run(validate_config({**TINY_BASE, "train": {**TINY_BASE["train"], "precision": "auto"}}))
    other = json.loads(json.dumps(plan.as_dict())) | {"precision": "bf16-mixed"}
    other["memory"]["activations"] += 1
    check_planned(cfg, plan, other)
    fixed = cfg.model_copy(update={"train": cfg.train.model_copy(update={"precision": "32"})})
    with pytest.raises(ValueError, match="memory.activations"):
        check_planned(fixed, plan, other)


def test_a_submitted_cell_records_its_plan_and_the_grid_reads_its_steps_from_it(tmp_path):
    """A budget in train.tokens_per_param: ``grid status`` (a grid read without plans) takes the steps from the
    plan recorded at submission, not from a count of its own."""
    train_ = {**TINY_BASE["train"], "tokens_per_param": 1, "devices": 1}
    train_.pop("max_steps")
    path = write_grid(tmp_path, base={**TINY_BASE, "train": train_}, axes={"seed": [0]})
    grid = load_grid(path)
    (cell,) = grid.cells
    assert record_plan(grid, cell) == cell_plan_path(grid, cell)
    LocalExecutor().submit(grid, grid.cells, print)
    assert read_jobs(grid)[cell.name][-1]["plan"] == str(cell_plan_path(grid, cell))  # the job's --planned
    recorded = json.loads(cell_plan_path(grid, cell).read_text())
    assert recorded == json.loads(json.dumps(cell.plan.as_dict()))
    unplanned = load_grid(path, resolve=False)
    assert planned_steps(unplanned, unplanned.cells[0]) == cell.plan.budget.max_steps
    recorded["budget"]["max_steps"] = 12345  # the recorded plan is the owner: nothing counts the steps again
    cell_plan_path(grid, cell).write_text(json.dumps(recorded))
    assert planned_steps(unplanned, unplanned.cells[0]) == 12345
    assert record_plan(unplanned, unplanned.cells[0]) is None and not cell_plan_path(grid, cell).exists()


def test_an_older_run_takes_its_processes_from_its_config_not_its_records(tmp_path):
    """A run written before plan.json: its world size is the config's, whatever its evaluation records' tokens."""
    run = tmp_path / "run"
    run.mkdir()
    train_ = {**TINY_BASE["train"], "devices": 2}
    (run / "config.yaml").write_text(json.dumps({**TINY_BASE, "train": train_}))
    write_eval_record(run, "longctx", {"step": 9, "tokens": 4 * 10 * 8 * 128})  # as if 4 processes had trained it
    plan = read_plan(run)
    assert plan.rebuilt and plan.budget.world_size == 2


@pytest.mark.parametrize("fraction, text, sets", [
    (0.0, False, [VAL_HELD_OUT]), (0.1, False, [VAL_HELD_OUT, VAL_SYNTHETIC]), (0.0, True, [VAL_HELD_OUT, VAL_TEXT]),
    (0.1, True, [VAL_HELD_OUT, VAL_SYNTHETIC, VAL_TEXT]),
])
def test_the_data_module_names_its_validation_sets_in_the_loaders_order(tmp_path, fraction, text, sets):
    doc = tmp_path / "val.txt"
    doc.write_text("plain text for the natural validation set. " * 200)
    data = {"max_tokens": 200_000, "synthetic": {"fraction": fraction}, "text_val_files": [str(doc)] if text else []}
    dm = LMDataModule(validate_config({"train": {"seq_len": 64, "batch_size": 2, "val_batches": 1}, "data": data}))
    dm.setup()
    loaders = dm.val_dataloader()
    assert dm.val_sets() == sets and len(loaders) == len(sets)
    if VAL_SYNTHETIC in sets:  # the synthetic loader yields (tokens, the queried-value mask)
        assert len(next(iter(loaders[sets.index(VAL_SYNTHETIC)]))) == 2


def test_a_job_takes_over_the_lock_of_its_earlier_start_by_the_identity_its_executor_records(tmp_path):
    """The lock knows no scheduler: the identity the executor sets (``set_job_identity``) decides."""
    run = tmp_path / "run"
    earlier = RunLock(run)
    try:
        set_job_identity({"test_job_id": "7"})
        earlier.acquire()
        assert json.loads((run / ".lock").read_text())["test_job_id"] == "7"
        with RunLock(run):  # the same job started again: the earlier start's lock is taken over
            pass
        earlier.release()
        earlier.acquire()
        set_job_identity({"test_job_id": "8"})
        with pytest.raises(ValueError, match=r"in use by another command \(pid \d+ on \S+, test_job_id 7"):
            RunLock(run).acquire()
        set_job_identity({})
        with pytest.raises(ValueError, match="in use by another command"):
            RunLock(run).acquire()
    finally:
        set_job_identity({})
        earlier.release()
    assert owner_identity() == {}


def test_the_set_routing_and_the_plan_check_are_asked_of_the_executor(tmp_path):
    """``--set`` items outside the run config are the parameters of an executor that takes a profile; one that
    takes none refuses them; ``grid plan`` without ``--executor`` picks by whether a profile is given."""
    from hybrid_lightning.grid.executor import executor_for
    from hybrid_lightning.grid.slurm import SlurmExecutor

    items = ["train.max_steps=5", "seed=1", "timeout_min=60"]
    assert SlurmExecutor.split_set(items) == (["train.max_steps=5", "seed=1"], ["timeout_min=60"])
    with pytest.raises(ValueError, match="--set timeout_min=60: not a key of the run config .* "
                                         "executor local takes no"):
        LocalExecutor.split_set(items)
    assert executor_for(None, None, items[:2]) is LocalExecutor
    assert executor_for(None, None, items) is executor_for(None, tmp_path / "p.yaml") is SlurmExecutor
    assert executor_for("local", tmp_path / "p.yaml") is LocalExecutor
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "accelerator": "cpu", "devices": 64}}
    grid = load_grid(write_grid(tmp_path, base=base, axes={"seed": [0]}), resolve=False)
    with pytest.raises(ValueError, match="cell seed=0: train.devices=64 on CPU"):
        LocalExecutor().check_plan(grid.cells)
