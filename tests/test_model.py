import itertools
import subprocess
import sys

import pytest
import torch

from hybrid_lightning import build_model, count_params
from hybrid_lightning.kinds import mixer_names

EFFICIENT = mixer_names(efficient_only=True)
PATTERNS = ["F", "E", "EF", "FE", "EEEF"]
POS = ["rope", "nope"]
VOCAB = 50


def tiny(pattern="EF", mixer="swa", full="rope", efficient="rope", window=4, n_layers=None, **kw):
    torch.manual_seed(0)
    cfg = {
        "n_layers": n_layers or max(2, len(pattern)), "d_model": 32, "n_heads": 2, "pattern": pattern, "mixer": mixer,
        "window": window, "pos": {"full": full, "efficient": efficient}, "vocab_size": VOCAB, **kw,
    }
    if cfg["n_layers"] % len(pattern):
        cfg["n_layers"] = len(pattern)
    return build_model(cfg).double().eval()


def test_build_model_returns_plain_module_with_logits():
    model = build_model({"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF"})
    assert isinstance(model, torch.nn.Module)
    logits = model(torch.randint(0, 257, (3, 11)))
    assert logits.shape == (3, 11, 257) and logits.dtype == torch.float32


def test_model_code_never_imports_lightning():
    code = (
        "import sys; from hybrid_lightning import build_model; build_model({'n_layers': 2, 'pattern': 'EF'});"
        "assert 'lightning' not in sys.modules and 'pytorch_lightning' not in sys.modules, 'lightning imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_count_params_splits_embedding():
    model = build_model({"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "vocab_size": 100})
    c = count_params(model)
    assert c["embedding"] == 2 * 100 * 32
    assert c["total"] == sum(p.numel() for p in model.parameters())
    assert c["non_embedding"] == c["total"] - c["embedding"]
    assert [layer["mixer"] for layer in c["layers"]] == ["swa", "full"]
    assert sum(layer["params"]["total"] for layer in c["layers"]) + 32 == c["non_embedding"]  # + the final norm
    tied = build_model({"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 100, "pattern": "EF",
                        "tie_embeddings": True})
    assert count_params(tied)["embedding"] == 100 * 32


@pytest.mark.parametrize("pattern, mixer, full, efficient", list(itertools.product(PATTERNS, EFFICIENT, POS, POS)))
def test_causality(pattern, mixer, full, efficient):
    """Changing tokens after t never changes the logits at positions <= t."""
    model = tiny(pattern, mixer, full, efficient, window=3, qk_norm=True, n_kv_heads=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (2, 24), generator=g)
    base = model(x)
    for t in (0, 5, 17, 22):
        y = x.clone()
        y[:, t + 1 :] = torch.randint(0, VOCAB, y[:, t + 1 :].shape, generator=g)
        assert torch.equal(model(y)[:, : t + 1], base[:, : t + 1]) or torch.allclose(
            model(y)[:, : t + 1], base[:, : t + 1], atol=1e-12)


def _depends(model, x, t, s) -> bool:
    """Do the logits at position t change when the token at position s changes?"""
    y = x.clone()
    y[:, s] = (y[:, s] + 1) % VOCAB
    return not torch.allclose(model(x)[:, t], model(y)[:, t], atol=1e-10, rtol=0)


@pytest.mark.parametrize("W", [1, 2, 5, 8])
@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_window_receptive_field_is_exact(W, n_layers):
    """With L SWA layers of window W the logits at t see exactly t-L(W-1) ... t."""
    model = tiny("E", "swa", window=W, n_layers=n_layers)
    x = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    t = 39
    field = n_layers * (W - 1) + 1
    for s in range(t - field + 1, t + 1):
        assert _depends(model, x, t, s), f"position {t} should see {s}"
    for s in range(t - field + 1):
        assert not _depends(model, x, t, s), f"position {t} should not see {s}"


def test_nope_full_attention_is_permutation_invariant():
    x = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
    t = 15
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(4))
    y = x.clone()
    y[:, :t] = x[:, :t][:, perm]
    nope = tiny("F", full="nope", n_layers=1)
    assert torch.allclose(nope(x)[:, t], nope(y)[:, t], atol=1e-10)
    rope = tiny("F", full="rope", n_layers=1)
    assert not torch.allclose(rope(x)[:, t], rope(y)[:, t], atol=1e-6)


@pytest.mark.parametrize("pattern, mixer", [(p, m) for p in ("EF", "EEEF", "F") for m in EFFICIENT])
def test_incremental_inference_matches_full_forward(pattern, mixer):
    model = tiny(pattern, mixer, window=5, n_kv_heads=1)
    x = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(5))
    full = model(x)
    for pieces in ([30], [1] * 30, [7, 1, 13, 9], [3, 27]):
        states, outs, start = model.new_states(), [], 0
        for n in pieces:
            outs.append(model(x[:, start : start + n], states))
            start += n
        assert torch.allclose(torch.cat(outs, dim=1), full, atol=1e-10)
