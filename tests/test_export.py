"""``hybrid-lightning export``: the transformers folder gives the native model's logits and greedy
output for every mixer and positional encoding, generates with its cache as without it, and a tiny
trained run scores the same in lm-evaluation-harness as in the package."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import TINY, run_cli

transformers = pytest.importorskip("transformers",
                                   reason="the export extra (transformers, safetensors) is not installed")

from greedy import exact_match_by_task, greedy_generate, score_probes  # noqa: E402
from hybrid_lightning.config import dump_config, load_config  # noqa: E402
from hybrid_lightning.data.tokenizer import ByteTokenizer  # noqa: E402
from hybrid_lightning.export.folder import load_native, write_folder  # noqa: E402
from hybrid_lightning.plan import build_model  # noqa: E402
from hybrid_lightning.plan.resolve import read_run  # noqa: E402
from hybrid_lightning.probes.files import read_probes  # noqa: E402

PROMPT, NEW = 40, 12
SMALL = {"d_model": 64, "n_heads": 4, "mamba2": {"head_dim": 16, "d_state": 16}, "recurrent_chunk": 16}
CASES = {
    "swa-window-shorter-than-prompt": {"pattern": "SF", "window": 8},
    "swa-window-longer-than-prompt": {"pattern": "SF", "window": 64},
    "swa-nope-full-rope-efficient": {"pattern": "SSF", "window": 16, "pos": {"full": "nope", "efficient": "rope"}},
    "swa-rope-full-nope-efficient-gqa-qknorm": {"pattern": "SF", "window": 8,
                                                "pos": {"full": "rope", "efficient": "nope"},
                                                "n_kv_heads": 2, "qk_norm": True},
    "mamba2": {"pattern": "MF"},
    "gated_deltanet": {"pattern": "GF", "pos": {"full": "nope"}},
    "kda": {"pattern": "KF"},
    "gated_deltaproduct": {"pattern": "PF", "gated_deltaproduct": {"householder": 3}},
    "lightning-tied": {"pattern": "LLF", "tie_embeddings": True},
    "all-mixers": {"pattern": "SMGLF", "window": 8},
}


def export_random(tmp_path, settings: dict):
    torch.manual_seed(0)
    settings = SMALL | settings
    model = build_model(settings | {"n_layers": len(settings["pattern"])}).eval()
    out = tmp_path / "hf"
    out.mkdir()
    write_folder(model, ByteTokenizer(), out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    return model, hf, out


def forward_lengths(hf) -> list[int]:
    """Records the sequence length of every forward of ``hf``'s native model."""
    lengths = []
    hf.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    return lengths


@pytest.mark.parametrize("case", list(CASES))
def test_exported_model_matches_the_native_one(tmp_path, case):
    model, hf, _ = export_random(tmp_path, CASES[case])
    ids = torch.randint(0, 256, (2, PROMPT))
    with torch.no_grad():
        native, exported = model(ids), hf(ids).logits
    assert exported.dtype == torch.float32
    assert ((native - exported).abs().max() / native.abs().max()).item() <= 1e-4
    expected = greedy_generate(model, ids, NEW, stop_id=ByteTokenizer.eos_id)
    lengths = forward_lengths(hf)
    cached = hf.generate(ids, max_new_tokens=NEW, do_sample=False)[:, PROMPT:]
    assert lengths == [PROMPT] + [1] * (NEW - 1)  # the prompt once, then one token per step: linear in NEW
    uncached = hf.generate(ids, max_new_tokens=NEW, do_sample=False, use_cache=False)[:, PROMPT:]
    assert torch.equal(cached, expected) and torch.equal(uncached, expected)


def test_generation_stops_at_the_stop_token_like_transformers(tmp_path):
    model, hf, _ = export_random(tmp_path, {"pattern": "SF", "window": 8})
    ids = torch.randint(0, 256, (1, PROMPT))
    free = greedy_generate(model, ids, NEW)[0].tolist()
    stop = free[3]  # a token the model emits: generation ends after its first occurrence
    expected = free[: free.index(stop) + 1]
    assert greedy_generate(model, ids, NEW, stop_id=stop)[0].tolist() == expected
    assert hf.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=stop,
                       pad_token_id=stop)[0, PROMPT:].tolist() == expected


def test_padded_batches_are_refused(tmp_path):
    _, hf, _ = export_random(tmp_path, {"pattern": "SF", "window": 8})
    mask = torch.ones(2, PROMPT, dtype=torch.long)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="unpadded"):
        hf(torch.randint(0, 256, (2, PROMPT)), attention_mask=mask)


def test_generation_exact_match_agrees_with_teacher_forcing():
    """score_probes counts a probe right iff every answer token is the argmax given the ones before
    (scoring.token_nll's teacher-forced exact match), here for answers that are and are not the greedy text."""
    from hybrid_lightning.eval.scoring import token_nll

    torch.manual_seed(0)
    model, tok = build_model(SMALL | {"n_layers": 3, "pattern": "SMF", "window": 8}).eval(), ByteTokenizer()
    with torch.no_grad():  # logit 0 for non-ASCII bytes and the end token: the greedy text is ASCII
        model.lm_head.weight[128:] = 0
    prompt = "The pass key is 4242. What is the pass key? The pass key is"
    greedy = tok.decode(greedy_generate(model, torch.from_numpy(tok.encode(prompt))[None], 6)[0].tolist())
    rows = [{"task": "passkey", "length": 0, "depth": d, "prompt": prompt, "answer": a}
            for d, a in ((0.0, greedy), (1.0, greedy[:-1] + ("x" if greedy[-1] != "x" else "y")))]
    records = score_probes(model, tok, rows)
    assert [r["exact"] for r in records] == [1, 0] and records[0]["generated"] == greedy
    for row, record in zip(rows, records):
        ids = torch.from_numpy(tok.encode(row["prompt"] + row["answer"]))[None]
        correct = token_nll(model, ids, chunk=16)[1][0, -len(row["answer"]):]
        assert bool(correct.all()) == bool(record["exact"])


def test_tokenizer_is_the_byte_tokenizer(tmp_path):
    _, _, out = export_random(tmp_path, {"pattern": "SF", "window": 8})
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    native = ByteTokenizer()
    text = "Grüße, 東京! " + bytes(range(32, 127)).decode() + "\n\t"
    assert tok(text).input_ids == native.encode(text).tolist()
    assert tok.decode(native.encode(text).tolist()) == text
    assert tok.eos_token_id == native.eos_id and tok.decode([104, 105, native.eos_id], skip_special_tokens=True) == "hi"
    every_byte = list(range(256))
    assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(every_byte)) == every_byte


def test_tokenizers_json_file_is_carried(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from hybrid_lightning.data.tokenizer import JsonTokenizer, load_tokenizer
    from hybrid_lightning.export.tokenizer import write_tokenizer
    from hybrid_lightning.probes.haystack import NOISE

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator([NOISE] * 50, trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(str(tmp_path / "bpe.json"))
    (tmp_path / "folder").mkdir()  # a tokenizer folder, as data.tokenizer accepts, exports the same way
    bpe.save(str(tmp_path / "folder" / "tokenizer.json"))
    assert (load_tokenizer(str(tmp_path / "folder")).backend.to_str()
            == JsonTokenizer(str(tmp_path / "bpe.json")).backend.to_str())
    native = load_tokenizer(str(tmp_path / "folder"))
    write_tokenizer(native, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = NOISE + " Where is the sun? 12345"
    assert tok(text).input_ids == native.encode(text).tolist() and len(native.encode(text)) < len(text)
    assert tok.decode(native.encode(text).tolist()) == native.decode(native.encode(text)) == text
    assert tok.eos_token_id == native.eos_id


def test_folder_needs_no_hybrid_lightning(tmp_path):
    """The folder loads in a Python that cannot import the package (only transformers and torch)."""
    model, _, out = export_random(tmp_path, {"pattern": "SMGLF", "window": 8})
    ids = torch.randint(0, 256, (1, 16))
    torch.save(ids, tmp_path / "ids.pt")
    script = (
        "import sys, torch\n"
        "sys.modules['hybrid_lightning'] = None  # any import of the package fails\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        f"torch.save(m(torch.load({str(tmp_path / 'ids.pt')!r})).logits, {str(tmp_path / 'logits.pt')!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with torch.no_grad():
        assert torch.allclose(torch.load(tmp_path / "logits.pt"), model(ids), rtol=0, atol=1e-5)


def test_export_user_errors(tmp_path):
    run = tmp_path / "run"  # a run directory whose training wrote no checkpoint yet
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config(None)))
    r = run_cli("export", str(run), "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "no checkpoint" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a").exists()
    r = run_cli("export", str(run), "--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "missing.ckpt" in r.stderr and not (tmp_path / "a").exists()
    r = run_cli("export", str(tmp_path), "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "config.yaml" in r.stderr and not (tmp_path / "a").exists()


@pytest.mark.slow
def test_cli_export_and_lm_eval_score_equal_the_package_score(tmp_path):
    """A tiny trained run, exported by the CLI: lm-evaluation-harness's ``hf`` model on the probes' task
    generates the package's greedy text for every probe, and the exact-match scores agree. Half of the
    probes get the model's own greedy continuation as answer, so the score is neither 0 nor 1."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install lm_eval accelerate)")
    pytest.importorskip("accelerate", reason="lm-evaluation-harness's hf model needs accelerate")
    run, out = tmp_path / "run", tmp_path / "hf"
    r = run_cli("train", "--run-dir", str(run), *TINY, "--set", "train.max_steps=20", "--set", "train.warmup_steps=2",
                "--set", "eval.at_end=false", "--set", "eval.heads.at_end=false", "--set", "eval.every_n_steps=0",
                "--set", "eval.heads.every_n_steps=0")
    assert r.returncode == 0, r.stderr[-3000:]
    probes = tmp_path / "probes.jsonl"
    assert run_cli("probes", "passkey", "niah_single_1", "--out", str(probes), "--lengths", "512",
                   "--samples", "3").returncode == 0
    model, tok = load_native(*read_run(run), run / "checkpoints" / "last.ckpt")
    rows = read_probes(probes)
    for row, record in zip(rows[::2], score_probes(model, tok, rows[::2])):
        assert tok.decode(tok.encode(record["generated"])) == record["generated"]  # re-encodes to itself
        row["answer"], row["text"] = record["generated"], row["prompt"] + record["generated"]
    probes.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "prompt"}) + "\n" for row in rows))
    records = score_probes(model, tok, read_probes(probes))
    ours = exact_match_by_task(records)
    assert 0 < ours["all"] < 1

    r = run_cli("export", str(run), "--out", str(out), "--probes", str(probes))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli("export", str(run), "--out", str(out))
    assert r.returncode == 2 and "--force" in r.stderr
    assert run_cli("export", str(run), "--out", str(out), "--probes", str(probes), "--force").returncode == 0

    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf",
         "--model_args", f"pretrained={out},trust_remote_code=True,dtype=float32",
         "--include_path", str(out / "lm_eval"), "--tasks", "hybrid_probes", "--batch_size", "1", "--device", "cpu",
         "--log_samples", "--output_path", str(tmp_path / "lm_eval_out")],
        capture_output=True, text=True, timeout=900, env={**os.environ, **offline}, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(next((tmp_path / "lm_eval_out").rglob("results_*.json")).read_text())["results"]
    assert results["hybrid_probes"]["exact_match,none"] == pytest.approx(ours["all"])
    for task in ("passkey", "niah_single_1"):
        assert results[f"hybrid_probes_{task}"]["exact_match,none"] == pytest.approx(ours[task])
        samples = [json.loads(line) for f in (tmp_path / "lm_eval_out").rglob(f"samples_hybrid_probes_{task}_*.jsonl")
                   for line in f.read_text().splitlines()]
        generated = {s["doc"]["depth"]: s["resps"][0][0] for s in samples}
        assert generated == {rec["depth"]: rec["generated"] for rec in records if rec["task"] == task}


def test_bad_probes_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        read_probes(tmp_path / "none.jsonl")
    (tmp_path / "p.jsonl").write_text(json.dumps({"text": "abc", "answer": "c"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: no \['task', 'length', 'depth'\]"):
        read_probes(tmp_path / "p.jsonl")
    (tmp_path / "p.jsonl").write_text(json.dumps({"text": "abc", "answer": "x", "task": "t", "length": 3,
                                                  "depth": 0}) + "\n")
    with pytest.raises(ValueError, match="does not end with its answer"):
        read_probes(tmp_path / "p.jsonl")


def test_the_folder_is_readable_by_others_as_the_umask_allows(tmp_path):
    """mkdtemp's 0700 and safetensors' 0600 would lock colleagues out of a folder on a shared filesystem."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = load_config(None, ["model.n_layers=1", "model.pattern=F", "model.d_model=32", "model.n_heads=2"])
    (run / "config.yaml").write_text(dump_config(cfg))
    model = build_model(cfg.model)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
               run / "checkpoints" / "last.ckpt")
    old = os.umask(0o027)
    try:
        from hybrid_lightning.export import export_run

        out = export_run(run, tmp_path / "hf", ckpt=run / "checkpoints" / "last.ckpt")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o750
    assert {p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()} == {0o640}
    assert (out / "model.safetensors").is_file()
