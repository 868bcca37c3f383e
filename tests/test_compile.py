"""``train.compile``: torch.compile of the model, in place."""

import pytest
import torch

from hybrid_lightning import build_model
from hybrid_lightning.config import config_to_dict, validate_config


def test_train_compile_compiles_the_model_in_place():
    from conftest import system_of

    cfg = validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF"},
                           "train": {"compile": True}})
    system = system_of(config_to_dict(cfg))
    assert system.model._compiled_call_impl is not None
    assert "model.embed.weight" in system.state_dict()  # checkpoints keep the eager names


@pytest.mark.slow
def test_compiled_model_matches_eager():
    """torch.compile (inductor) of a tiny hybrid: loss and gradients equal eager within fp32 tolerance
    (about 1.5 minutes of compilation on 2 cores)."""
    cfg = {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 8, "vocab_size": 50}
    torch.manual_seed(0)
    eager = build_model(cfg)
    compiled = build_model(cfg)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    x = torch.randint(0, 50, (2, 41), generator=torch.Generator().manual_seed(0))
    results = []
    for model in (eager, compiled):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (loss_e, grads_e), (loss_c, grads_c) = results
    assert abs(loss_e.item() - loss_c.item()) <= 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(grads_e, grads_c)) <= 1e-5


def test_compile_may_change_when_a_run_is_resumed(tmp_path):
    from hybrid_lightning.config import dump_config
    from hybrid_lightning.training.resume import check_same_run

    (tmp_path / "config.yaml").write_text(dump_config(validate_config({})))
    check_same_run(tmp_path, validate_config({"train": {"compile": True}}))  # no error
    with pytest.raises(ValueError, match="train.lr"):
        check_same_run(tmp_path, validate_config({"train": {"lr": 1.0e-4}}))
