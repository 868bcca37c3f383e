"""Activation checkpointing (``train.activation_checkpointing``) and the memory estimate of a run."""

import pytest
import torch

from conftest import system_of
from hybrid_lightning.plan import build_model, resolve_model_config
from hybrid_lightning.runplan import GIB

VOCAB = 50


def loss_and_grads(mixer: str, checkpointing: bool, doc_ids=None):
    torch.manual_seed(0)
    cfg = resolve_model_config({"n_layers": 4, "d_model": 32, "n_heads": 2, "pattern": "EEEF", "mixer": mixer,
                                "window": 16, "mamba2": {"head_dim": 16, "d_state": 8}}, vocab_size=VOCAB)
    model = build_model(cfg)
    model.activation_checkpointing = checkpointing
    tokens = torch.randint(0, VOCAB, (2, 97), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1], doc_ids=doc_ids)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mixer", ["swa", "mamba2", "gated_deltanet", "lightning", "kda", "gated_deltaproduct"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(mixer):
    doc_ids = torch.tensor([[0] * 30 + [1] * 66, [0] * 96])
    for docs in (None, doc_ids):
        loss, grads = loss_and_grads(mixer, False, docs)
        loss_ckpt, grads_ckpt = loss_and_grads(mixer, True, docs)
        assert torch.equal(loss, loss_ckpt)  # the recomputed forward is the same computation
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_ckpt))


def test_the_training_system_switches_checkpointing_on():
    raw = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "vocab_size": 257}}
    assert system_of(raw).model.activation_checkpointing is False
    assert system_of({**raw, "train": {"activation_checkpointing": True}}).model.activation_checkpointing is True


@pytest.mark.parametrize("name", ["SWA-64 EEEF, d=128", "Gated DeltaNet EF, d=64", "Mamba-2 EF, d=64"])
def test_the_estimate_is_within_a_quarter_of_the_measured_peak(name):
    """The estimate against one measured CPU training step, activation checkpointing off and on."""
    from hybrid_lightning.bench.memory import MODELS, config, measured_peak
    from hybrid_lightning.plan.resolve import make_plan

    cfg = config(MODELS[name], 8, 256)
    estimate = make_plan(cfg).memory_estimate
    for on in (False, True):
        measured = measured_peak(cfg, on)
        assert 0.75 <= estimate.peak(on) / measured <= 1.25, (on, estimate.peak(on), measured)
    assert estimate.peak(True) < estimate.peak(False)


def test_a_size_beyond_the_machine_is_refused_before_anything_is_allocated(tmp_path, capsys, monkeypatch):
    """Issue 24 item 9: one line, exit 2, the estimate named, no run directory, store or lock left."""
    import time

    from hybrid_lightning.cli import main

    monkeypatch.setenv("HYBRID_LIGHTNING_CACHE", str(tmp_path / "cache"))
    start = time.process_time()  # CPU time: other jobs on the machine do not inflate it
    code = main(["train", "--run-dir", str(tmp_path / "run"), "--set", "model.n_layers=4000", "--set",
                 "model.d_model=2048"])  # within the bounds of model.n_layers, terabytes of weights
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "estimated peak memory" in err and "GiB per device" in err and "RAM" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
    assert time.process_time() - start < 30


def test_grid_plan_of_a_huge_model_answers_fast(tmp_path):
    import time

    from hybrid_lightning.grid import load_grid
    from hybrid_lightning.grid.report import plan_rows, plan_table

    grid = tmp_path / "huge.yaml"
    grid.write_text("name: huge\nbase: {train: {max_steps: 30}, model: {d_model: 2048}}\n"
                    "axes:\n  model.n_layers: [4, 4000]\n")
    start = time.process_time()  # this process's CPU time: other jobs on the machine do not inflate it
    loaded = load_grid(grid, tmp_path / "runs")
    rows = plan_rows(loaded)
    assert time.process_time() - start < 30
    small, huge = rows
    assert huge["non_embedding_params"] == 1000 * small["non_embedding_params"] - 999 * 2048  # one final norm
    assert huge["peak_memory"] > 1000 * 2**30 > small["peak_memory"]
    assert "GiB" in plan_table(loaded, rows)


@pytest.mark.slow  # about 30 s: the fake forwards of the counted lengths
def test_the_estimate_of_a_long_sequence_follows_the_counted_line():
    """Beyond MEASURED_LENGTH the activations come from two counted lengths: the bytes of counting at the
    length itself, and a billion tokens answer at once."""
    import dataclasses

    from hybrid_lightning.config import validate_config
    from hybrid_lightning.plan import memory
    from hybrid_lightning.plan.resolve import make_plan

    def estimate(T: int, mixer: str):
        cfg = validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "mixer": mixer,
                                         "vocab_size": 257}, "train": {"batch_size": 1, "seq_len": 256}})
        plan = make_plan(cfg)
        longer = dataclasses.replace(plan, budget=dataclasses.replace(plan.budget, seq_len=T))
        return memory.estimate_memory(longer, False)

    for mixer in ("swa", "gated_deltanet"):
        for T, tol in ((12_288, 0), (12_000, 0.025)):  # a length that is no multiple of the kernels' tiles: within 2.5%
            extended = estimate(T, mixer)
            memory.MEASURED_LENGTH, saved = 10**6, memory.MEASURED_LENGTH
            try:
                counted = estimate(T, mixer)
            finally:
                memory.MEASURED_LENGTH = saved
            assert abs(extended.activations / counted.activations - 1) <= tol
            assert abs(extended.checkpointed / counted.checkpointed - 1) <= tol
        assert estimate(10**9, mixer).peak() > 1000 * GIB
