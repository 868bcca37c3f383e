"""A new mixer is one module registered by one call (``kinds.register``), named nowhere in the package: configs
accept it, the model builds it, the run plan counts it and names its fast paths, training and both evaluation
callbacks handle it, an export carries it, and analysis labels it by its name."""

import importlib
import json
import sys

import pandas as pd
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.config import validate_config
from hybrid_lightning.kinds import KINDS, MixerKind, register
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.resolve import param_table, plan_run
from hybrid_lightning.training.run import train

# The whole mixer, as a user would write it: its class and its definition, registered by one call. The class
# may sit beside the definition here because a test module may import torch; the package's definitions keep
# to plain Python so that validating a config does not import torch (docs/extending.md).
TOY_MODULE = "toy_cumulative_mean"
TOY_SOURCE = '''"""A toy causal mixer: y_t = W_o mean_{s <= t} W_v x_s, its state the running sum and count."""

from __future__ import annotations

import torch
from torch import nn

from hybrid_lightning.kinds import MixerKind, register


class CumulativeMean(nn.Module):
    def __init__(self, opts, spec):  # opts: MixerOptions (d_model, norm_eps), the mixer having no options of its own
        super().__init__()
        self.v = nn.Linear(opts.d_model, opts.d_model, bias=False)
        self.out = nn.Linear(opts.d_model, opts.d_model, bias=False)

    def forward(self, x: torch.Tensor, state: dict | None = None) -> torch.Tensor:
        B, T, D = x.shape
        state = {} if state is None else state
        sums = state.get("sum", torch.zeros(B, 1, D, dtype=x.dtype)) + self.v(x).cumsum(1)  # (B, T, D)
        counts = state.get("n", 0) + torch.arange(1, T + 1, dtype=x.dtype).view(1, T, 1)
        state["sum"], state["n"] = sums[:, -1:], state.get("n", 0) + T
        return self.out(sums / counts)


KIND = register(MixerKind("cumulative_mean", "C", "toy_cumulative_mean.CumulativeMean", title="cumulative mean"))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy mixer's module, written to a folder on the path and imported (which registers it); the registry
    restored afterwards."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / f"{TOY_MODULE}.py").write_text(TOY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    before = dict(KINDS)
    yield importlib.import_module(TOY_MODULE)
    KINDS.clear()
    KINDS.update(before)
    sys.modules.pop(TOY_MODULE, None)


def toy_config(name: str) -> dict:
    return {
        "name": "toy",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "mixer": name},
        "data": {"max_tokens": 200_000},
        "train": {"max_steps": 6, "batch_size": 2, "seq_len": 64, "warmup_steps": 1, "log_every_n_steps": 2,
                  "val_every_n_steps": 6, "val_batches": 1, "checkpoint_every_n_steps": 6, "progress_bar": False},
        "eval": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5], "position_sequences": 0,
                 "heads": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5],
                           "value_tokens": None}},
    }


def test_every_registered_mixer_names_a_class_that_imports():
    for kind in KINDS.values():
        assert issubclass(kind.mixer_class(), nn.Module), kind.name
        for module in kind.sources:
            importlib.import_module(module)


def test_the_registry_refuses_a_taken_name_or_letter(toy):
    assert KINDS["cumulative_mean"] is toy.KIND
    assert register(toy.KIND) is toy.KIND  # the same definition again (a second import) is no change
    with pytest.raises(ValueError, match="letter 'C'.*already registered"):
        register(MixerKind("other", "C", "x.Y"))
    with pytest.raises(ValueError, match="name 'swa'"):
        register(MixerKind("swa", "Q", "x.Y"))
    with pytest.raises(ValueError, match="one capital letter"):
        register(MixerKind("lower", "q", "x.Y"))


def test_a_registered_toy_mixer_trains_plans_exports_and_is_analysed_by_its_name(toy, tmp_path, capsys, monkeypatch):
    from hybrid_lightning.plan import precision

    # A CPU without bf16 instructions, whatever this one has: on one with them the toy mixer (no bf16 measurement)
    # adds the "unmeasured" note to the plan (tests/test_perf.py covers that note).
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: False)
    cfg = validate_config(toy_config(toy.KIND.name))
    model = build_model(cfg.model)
    assert [type(b.mixer).__name__ for b in model.layers] == ["CumulativeMean", "Attention"]
    x = torch.randint(0, 257, (1, 40))
    states = model.new_states()
    pieces = torch.cat([model(x[:, :17], states), model(x[:, 17:], states)], dim=1)
    torch.testing.assert_close(pieces, model(x), rtol=1e-4, atol=1e-5)  # the state contract holds

    _, plan = plan_run(cfg, sources=False)
    assert [(layer.mixer, layer.letter) for layer in plan.layers] == [("cumulative_mean", "C"), ("full", "F")]
    assert plan.layers[0].params["mixer"] == 2 * 32 * 32 and "cumulative_mean" in param_table(plan)
    assert plan.kernels == {"device": "cpu", "attention": {"full": "sdpa"}, "recurrent": None, "compile": False,
                            "notes": ()}

    run_dir = train(cfg, tmp_path / "runs" / "toy")
    start = next(line for line in capsys.readouterr().out.splitlines() if "from step 0" in line)
    assert start.endswith("; 32-true, kernels on cpu: attention sdpa (full); compile off")  # the start line
    assert json.loads((run_dir / "plan.json").read_text())["kernels"]["attention"] == {"full": "sdpa"}
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "# precision 32-true, kernels on cpu: attention sdpa (full); compile off" in config_text  # TensorBoard
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["heads_step_6.json", "step_6.json"]  # at the end
    out = tmp_path / "analysis"
    analyze(tmp_path / "runs", out)
    runs = pd.read_csv(out / "runs.csv")
    assert runs["label"].tolist() == ["cumulative_mean EF"]
    layers = json.loads((run_dir / "eval" / "heads_step_6.json").read_text())["layers"]
    assert [(layer["mixer"], layer["applicable"]) for layer in layers] == [("cumulative_mean", False), ("full", True)]

    transformers = pytest.importorskip("transformers", reason="the export extra (transformers) is not installed")
    from hybrid_lightning.export.folder import export_run, load_native
    from hybrid_lightning.plan.resolve import read_run

    folder = export_run(run_dir, tmp_path / "hf_toy")  # transformers caches remote code by folder name: one of its own
    assert (folder / f"hl_{TOY_MODULE}.py").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    native, _ = load_native(*read_run(run_dir), run_dir / "checkpoints" / "last.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, native(x), rtol=0, atol=1e-5)
