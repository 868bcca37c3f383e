"""Parameter matching (model.match_params) and the `params` report."""

import re

import pytest
import torch

from conftest import run_cli
from hybrid_lightning import build_model, count_params
from hybrid_lightning.plan import resolve_model_config
from hybrid_lightning.plan.matching import MATCH_TOLERANCE, match_params, param_report

# The paper's seven architectures (3 efficient : 1 full), each matched to the full-attention model.
ARCHITECTURES = {
    "full": {"pattern": "F"},
    "swa128": {"pattern": "EEEF", "mixer": "swa", "window": 128},
    "swa512": {"pattern": "EEEF", "mixer": "swa", "window": 512},
    "swa2048": {"pattern": "EEEF", "mixer": "swa", "window": 2048},
    "lightning": {"pattern": "EEEF", "mixer": "lightning"},
    "mamba2": {"pattern": "EEEF", "mixer": "mamba2"},
    "gated_deltanet": {"pattern": "EEEF", "mixer": "gated_deltanet"},
    "kda": {"pattern": "EEEF", "mixer": "kda"},  # beyond the paper's seven
    "gated_deltaproduct": {"pattern": "EEEF", "mixer": "gated_deltaproduct"},
}
SIZES = {  # about 25M and 300M non-embedding parameters, inside the paper's 15M-477M range
    "small": {"d_model": 512, "n_layers": 8, "n_heads": 8},
    "large": {"d_model": 1024, "n_layers": 24, "n_heads": 16},
}


def meta_model(cfg):
    with torch.device("meta"):
        return build_model(cfg)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_paper_architectures_match_the_full_attention_reference(arch, size):
    """B5: after matching, every architecture's non-embedding count is within 2% of full attention's."""
    cfg = resolve_model_config({**SIZES[size], **ARCHITECTURES[arch], "match_params": "F"})
    reference = count_params(meta_model(resolve_model_config({**SIZES[size], "pattern": "F"})))
    model = meta_model(cfg)
    counts = count_params(model)
    deviation = counts["non_embedding"] / reference["non_embedding"] - 1
    assert abs(deviation) <= MATCH_TOLERANCE
    assert param_report(cfg).matched == counts["non_embedding"]
    # Only the non-full layers' SwiGLU width moves: full-attention layers are the reference's own.
    for layer, ref_layer, spec in zip(counts["layers"], reference["layers"], model.plan):
        if spec.is_full:
            assert layer == ref_layer
        else:
            assert spec.mlp_hidden == param_report(cfg).width


def test_unmatched_recurrent_hybrid_is_far_from_the_reference():
    """Why matching exists: unmatched, a Mamba-2 hybrid is well above the full-attention count."""
    cfg = resolve_model_config({**SIZES["small"], "pattern": "EEEF", "mixer": "mamba2"})
    report = param_report(cfg)
    assert report.reference_pattern == "F" and report.deviation > 0.1
    matched = match_params(cfg.model_copy(update={"match_params": "F"}))
    assert matched.width < report.width and abs(matched.deviation) < 0.001


def test_matching_against_another_reference():
    cfg = resolve_model_config({"d_model": 128, "n_layers": 4, "pattern": "GGGF", "match_params": "MMMF"})
    report = match_params(cfg)
    mamba = count_params(meta_model(resolve_model_config({"d_model": 128, "n_layers": 4, "pattern": "MMMF"})))
    assert report.reference == mamba["non_embedding"] and abs(report.deviation) <= MATCH_TOLERANCE


@pytest.mark.parametrize("model, message", [
    ({"pattern": "F", "match_params": "M"}, "no non-full layer"),
    ({"d_model": 32, "n_heads": 2, "mixer": "mamba2", "mamba2": {"d_state": 512, "head_dim": 16}, "match_params": "F"},
     "mixers alone"),
])
def test_impossible_matches_name_the_field(model, message):
    with pytest.raises(ValueError, match=f"model.match_params.*{message}"):
        build_model(model)


def test_match_params_excludes_a_fixed_width():
    with pytest.raises(ValueError, match="model.efficient_mlp_hidden"):
        build_model({"match_params": "F", "efficient_mlp_hidden": 64})


def test_efficient_mlp_hidden_sets_only_non_full_layers():
    model = meta_model({"pattern": "EEEF", "mixer": "lightning", "efficient_mlp_hidden": 96})
    assert [s.mlp_hidden for s in model.plan] == [96, 96, 96, resolve_model_config({}).mlp_width]


def test_params_command_reports_the_match():
    r = run_cli("params", "--set", "model.mixer=mamba2", "--set", "model.match_params=F", "--set", "model.d_model=256")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    reference, matched, deviation = re.search(
        r"non-embedding ([\d,]+)  this model ([\d,]+)  deviation ([-+\d.]+)%", line).groups()
    reference, matched = int(reference.replace(",", "")), int(matched.replace(",", ""))
    assert abs(matched / reference - 1) <= MATCH_TOLERANCE and abs(float(deviation)) <= 100 * MATCH_TOLERANCE
    assert "matched from" in line
    bad = run_cli("params", "--set", "model.match_params=Q")
    assert bad.returncode == 2 and "model.match_params" in bad.stderr and "Traceback" not in bad.stderr
