"""A new mixer is its class plus one row of the kinds table: configs accept it, the model builds it,
training, both evaluation callbacks and analysis handle it, and analysis labels it by its name."""

import json

import pandas as pd
import torch
from torch import nn

from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.config import validate_config
from hybrid_lightning.kinds import KINDS, MixerKind
from hybrid_lightning.plan import build_model
from hybrid_lightning.model.mixers import MIXERS, check_registry
from hybrid_lightning.training.run import train


class CumulativeMean(nn.Module):
    """y_t = W_o mean_{s <= t} W_v x_s: a causal mixer whose state is the running sum and count."""

    def __init__(self, opts, spec):  # opts: model/options.MixerOptions, the kind having no options of its own
        super().__init__()
        self.v = nn.Linear(opts.d_model, opts.d_model, bias=False)
        self.out = nn.Linear(opts.d_model, opts.d_model, bias=False)

    def forward(self, x: torch.Tensor, state: dict | None = None) -> torch.Tensor:
        B, T, D = x.shape
        past_sum = torch.zeros(B, 1, D, dtype=x.dtype) if state is None else state.get("sum", torch.zeros(B, 1, D, dtype=x.dtype))
        past_n = 0 if state is None else state.get("n", 0)
        sums = past_sum + self.v(x).cumsum(1)  # (B, T, D)
        counts = past_n + torch.arange(1, T + 1, dtype=x.dtype).view(1, T, 1)
        if state is not None:
            state["sum"], state["n"] = sums[:, -1:], past_n + T
        return self.out(sums / counts)


TOY = MixerKind("cumulative_mean", "C", title="cumulative mean")


def register(monkeypatch) -> None:
    monkeypatch.setitem(KINDS, TOY.name, TOY)
    monkeypatch.setitem(MIXERS, TOY.name, CumulativeMean)


def test_the_registry_check_catches_a_kind_without_a_class(monkeypatch):
    monkeypatch.setitem(KINDS, TOY.name, TOY)
    try:
        check_registry()
    except RuntimeError as e:
        assert "cumulative_mean" in str(e)
    else:
        raise AssertionError("a kind without a class passed the registry check")


def test_a_toy_mixer_trains_evaluates_and_is_analysed_by_its_name(monkeypatch, tmp_path):
    register(monkeypatch)
    raw = {
        "name": "toy",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "mixer": TOY.name},
        "data": {"max_tokens": 200_000},
        "train": {"max_steps": 6, "batch_size": 2, "seq_len": 64, "warmup_steps": 1, "log_every_n_steps": 2,
                  "val_every_n_steps": 6, "val_batches": 1, "checkpoint_every_n_steps": 6, "progress_bar": False},
        "eval": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5], "position_sequences": 0,
                 "heads": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5], "value_tokens": None}},
    }
    cfg = validate_config(raw)
    model = build_model(cfg.model)
    assert [type(b.mixer).__name__ for b in model.layers] == ["CumulativeMean", "Attention"]
    x = torch.randint(0, 257, (1, 40))
    states = model.new_states()
    pieces = torch.cat([model(x[:, :17], states), model(x[:, 17:], states)], dim=1)
    torch.testing.assert_close(pieces, model(x), rtol=1e-4, atol=1e-5)  # the state contract holds

    run_dir = train(cfg, tmp_path / "runs" / "toy")
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["heads_step_6.json", "step_6.json"]  # at the end
    out = tmp_path / "analysis"
    analyze(tmp_path / "runs", out)
    runs = pd.read_csv(out / "runs.csv")
    assert runs["label"].tolist() == ["cumulative_mean EF"]
    layers = json.loads((run_dir / "eval" / "heads_step_6.json").read_text())["layers"]
    assert [(layer["kind"], layer["applicable"]) for layer in layers] == [("cumulative_mean", False), ("full", True)]
