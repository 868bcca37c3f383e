"""The exported folder speaks ``transformers``' conventions, as scripts written for Llama-like models read them
(the paper's authors' tracing, probing and gradient scripts): ``output_attentions``, ``output_hidden_states``,
``inputs_embeds``, the config's head fields and Llama's names for the attention weights."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers",
                                   reason="the export extra (transformers, safetensors) is not installed")

from safetensors.torch import load_file  # noqa: E402

from hybrid_lightning.data.tokenizer import ByteTokenizer  # noqa: E402
from hybrid_lightning.export.folder import write_folder  # noqa: E402
from hybrid_lightning.plan import build_model  # noqa: E402

SETTINGS = {"d_model": 64, "n_heads": 4, "n_kv_heads": 2, "qk_norm": True, "window": 8, "pattern": "SLFH",
            "n_layers": 4, "recurrent_chunk": 16}
T = 24


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(SETTINGS).eval()
    out = tmp_path_factory.mktemp("export") / "hf"
    out.mkdir()
    write_folder(model, ByteTokenizer(), out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, attn_implementation="eager",
                                                           local_files_only=True).eval()
    return model, hf, out


def mixer_inputs(model, ids):
    """Each block's mixer input (after its norm) in a plain native forward."""
    seen = {}
    for i, block in enumerate(model.layers):
        block.mixer.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
    with torch.no_grad():
        model(ids)
    return seen


def test_attentions_are_the_probabilities_the_mixers_use(exported):
    """For every attention layer, probabilities @ values through the output projection rebuild the mixer's output
    (so the maps are the ones the model computes with); zero outside the causal window; None for Lightning."""
    model, hf, _ = exported
    ids = torch.randint(0, 256, (2, T))
    with torch.no_grad():
        out = hf(ids, output_attentions=True, use_cache=False)
    inputs = mixer_inputs(model, ids)
    assert len(out.attentions) == 4 and out.attentions[1] is None
    for i in (0, 2, 3):  # SWA, full, head-wise (heads 0-1 full, 2-3 windowed)
        mixer, probs = model.layers[i].mixer, out.attentions[i]  # (B, H, T, T)
        assert probs.shape == (2, 4, T, T)
        with torch.no_grad():
            _, _, v = mixer.project(inputs[i], 0)
            y = probs @ v.repeat_interleave(2, dim=1)  # (B, H, T, Dh)
            expected = mixer(inputs[i])
        rebuilt = mixer.wo(y.transpose(1, 2).reshape(2, T, -1))
        torch.testing.assert_close(rebuilt, expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, T))
    window = torch.ones(T, T).tril() - torch.ones(T, T).tril(-SETTINGS["window"])  # keys t-7 .. t
    assert bool((out.attentions[0][..., window == 0] == 0).all()) and bool((out.attentions[0][..., window == 1] > 0)
                                                                            .all())
    assert bool((out.attentions[2][..., torch.ones(T, T).triu(1) == 1] == 0).all())
    headwise = out.attentions[3]
    assert bool((headwise[:, 2:, window == 0] == 0).all()) and bool((headwise[:, :2, window == 0] > 0).any())


def test_hidden_states_are_the_blocks_outputs_and_embeds_give_the_logits(exported):
    model, hf, _ = exported
    ids = torch.randint(0, 256, (1, T))
    outputs = []
    hooks = [block.register_forward_hook(lambda m, a, y: outputs.append(y)) for block in model.layers]
    with torch.no_grad():
        logits = model(ids)
        out = hf(ids, output_hidden_states=True, use_cache=False)
        embedded = hf(inputs_embeds=model.embed(ids), use_cache=False)
    for hook in hooks:
        hook.remove()
    assert len(out.hidden_states) == SETTINGS["n_layers"] + 1
    torch.testing.assert_close(out.hidden_states[0], model.embed(ids))
    for native, exported_state in zip(outputs, out.hidden_states[1:], strict=True):
        torch.testing.assert_close(exported_state, native, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(embedded.logits, logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="use_cache=False"):
        hf(ids, output_attentions=True, use_cache=True)


def test_llama_names_and_config_fields_rebuild_the_model_exactly(exported):
    model, hf, out = exported
    stored = load_file(str(out / "model.safetensors"))
    for i in (0, 2):
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj"),
                             ("q_norm", "q_norm")):
            assert torch.equal(stored[f"model.layers.{i}.self_attn.{theirs}.weight"],
                               getattr(model.layers[i].mixer, ours).weight)
    assert not any(".self_attn." in k for k in stored if k.startswith("model.layers.1."))  # Lightning keeps its names
    assert not any(".mixer.wq." in k for k in stored)
    native = model.state_dict()
    loaded = hf.model.state_dict()
    assert loaded.keys() == native.keys()
    assert all(torch.equal(loaded[k], native[k]) for k in native)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["hidden_size"] == 64


def test_the_tokenizer_loads_as_the_authors_scripts_call_it(exported):
    """``AutoTokenizer`` with truncation to a length, and ``encode`` without special tokens (needle variants)."""
    *_, out = exported
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True, local_files_only=True)
    text = "The pass key is 12345. Remember it."
    encoded = tok(text, return_tensors="pt", truncation=True, max_length=10)
    assert encoded["input_ids"][0].tolist() == ByteTokenizer().encode(text).tolist()[:10]
    assert tok.encode(" 12345", add_special_tokens=False) == ByteTokenizer().encode(" 12345").tolist()
