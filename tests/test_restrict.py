"""Receptive-field restriction (hybrid_lightning/model/restrict.py): exact for attention, for Lightning through its
decayed state, and for the other recurrent mixers by recomputation; each checked against recomputing every position
from scratch over its last R inputs, written here from the definition."""

import pytest
import torch

from hybrid_lightning.model.restrict import applicable, receptive_field, restricted_layers
from test_model import tiny

T = 24


def from_scratch(mixer, x: torch.Tensor, R: int) -> torch.Tensor:
    """The definition: position t's output is the mixer's last output on x[t-R+1 .. t] alone (fresh state)."""
    return torch.stack([mixer(x[:, max(0, t - R + 1) : t + 1])[:, -1] for t in range(x.shape[1])], dim=1)


def ids(n: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(seed))


def test_full_attention_at_r_at_least_t_and_swa_at_r_at_least_w_change_nothing():
    model = tiny("EF", mixer="swa", window=8)
    x = ids()
    with torch.no_grad():
        plain = model(x)
        for part, R in (("full", T), ("full", T + 7), ("efficient", 8), ("efficient", 100)):
            with receptive_field(model, part, R):
                assert torch.equal(model(x), plain), (part, R)


def test_restricted_full_attention_is_a_window_of_r():
    """Full attention limited to R tokens is sliding-window attention of window R with the same weights."""
    full, swa = tiny("F", window=5), tiny("E", mixer="swa", window=5)
    swa.load_state_dict(full.state_dict())
    x = ids()
    with torch.no_grad(), receptive_field(full, "full", 5):
        assert torch.equal(full(x), swa(x))
        states = full.new_states()  # fed in pieces: the KV cache keeps R-1 keys
        pieces = torch.cat([full(x[:, a : a + 7], states) for a in range(0, T, 7)], dim=1)
    torch.testing.assert_close(pieces, swa(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mixer", ["lightning", "mamba2", "gated_deltanet", "swa", "headwise"])
def test_a_restricted_layer_equals_recomputing_each_position_over_its_last_r_tokens(mixer):
    """fp32, outputs within 1e-5; whole and in pieces through the state (Lightning by its decayed state, the others
    by recomputation)."""
    torch.manual_seed(1)
    extra = {"headwise": {"heads": "SS"}} if mixer == "headwise" else {}  # every head windowed: all limited
    model = tiny("EF", mixer=mixer, window=12, **extra).float()
    layer = model.layers[0].mixer
    x = torch.randn(2, T, 32)
    for R in (1, 7):
        with torch.no_grad():
            expected = from_scratch(layer, x, R)
            with receptive_field(model, "efficient", R):
                whole = layer(x)
                state = {}
                pieces = torch.cat([layer(x[:, a : a + 5], state) for a in range(0, T, 5)], dim=1)
        torch.testing.assert_close(whole, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(pieces, expected, rtol=0, atol=1e-5)
        assert layer.receptive_field is None  # restored


def test_a_restricted_model_does_not_see_beyond_its_reach():
    """Two restricted layers of R tokens reach 2(R-1) tokens back: a change further back leaves the output alone."""
    model = tiny("EE", mixer="lightning")
    x, R = ids(), 6
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 50
    with torch.no_grad(), receptive_field(model, "efficient", R):
        a, b = model(x), model(y)
    reach = 10 + 2 * (R - 1)
    torch.testing.assert_close(a[:, reach + 1 :], b[:, reach + 1 :], rtol=0, atol=1e-12)
    assert (a[:, reach] - b[:, reach]).abs().max() > 1e-6


def test_which_layers_and_refusals(capsys):
    model = tiny("EEEF", mixer="mamba2")
    assert restricted_layers(model, "full") == {3: None}
    assert restricted_layers(model, "efficient") == {0: None, 1: None, 2: None}
    with pytest.raises(ValueError, match="layers 'middle'"):
        restricted_layers(model, "middle")
    with pytest.raises(ValueError, match="positive number of tokens"), receptive_field(model, "full", 0):
        pass
    with receptive_field(model, None, None) as same:
        assert same is model
    full = tiny("F")
    with pytest.raises(ValueError, match="no efficient layers or heads"), receptive_field(full, "efficient", 4):
        pass
    assert applicable(full, [("efficient", 4), ("full", 4)]) == [("full", 4)]
    assert "--limit efficient:4 left out: the model has no efficient layers or heads" in capsys.readouterr().err


def test_a_headwise_layer_is_restricted_head_by_head():
    """Its full heads are full layers' and its windowed heads efficient ones': a restriction limits only its own."""
    W = 6
    model = tiny("H", window=W, headwise={"heads": "FS"})
    assert restricted_layers(model, "full") == {0: frozenset({0}), 1: frozenset({0})}

    def like(heads: str, window: int):  # the same weights, other heads
        other = tiny("H", window=window, headwise={"heads": heads})
        other.load_state_dict(model.state_dict())
        return other

    x = ids()
    with torch.no_grad():
        plain = model(x)
        with receptive_field(model, "efficient", W):
            assert torch.equal(model(x), plain)  # the full head untouched
        with receptive_field(model, "efficient", 3):
            assert torch.equal(model(x), like("FS", 3)(x))
            states = model.new_states()  # in pieces: the cache keeps every key for the full head
            pieces = torch.cat([model(x[:, a : a + 5], states) for a in range(0, T, 5)], dim=1)
            torch.testing.assert_close(pieces, like("FS", 3)(x), rtol=0, atol=1e-12)
        with receptive_field(model, "full", W):
            assert torch.equal(model(x), like("SS", W)(x))
        assert all(m.mixer.receptive_field is None and m.mixer.restricted_heads is None for m in model.layers)
