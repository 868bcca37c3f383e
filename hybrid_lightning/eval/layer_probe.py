"""Layer-wise probing (Qiao et al. 2026, arXiv 2606.15378, Finding 2; the authors' ``src/probing`` in
thunlp/rethinking-hybrid-attention, whose definitions this follows): where in the depth of a model does the needle's
value reach the last token?

The prompts are theirs (``01_prepare_data.py``, ``--haystack_type repeat --difficulty hard``): RULER's repeated noise
block, one needle "One of the special magic numbers for {key} is: {value}." at a random block boundary between a
quarter and three quarters of the haystack, the question at the end; the value is one of 8 "hard" candidates
differing in the last digit, its index the class. Here the haystack holds as many noise blocks as fit ``length``
tokens of the run's tokenizer (theirs: max(100, seq_len // 100) blocks), and the keys are wonderwords' adjective-noun
pairs (RULER's lists). The features (``02_extract_hiddenstate.py``): layer i's residual stream at the last token,
the output of block i (``residual``), or that minus block i's input (``delta``). The classifier
(``03_train_probing.py``): an 80/20 split stratified by class (``train_test_split``, random_state 42), standardised
on the training part, a one-vs-rest L2 logistic regression (liblinear, C = 0.1, max_iter 1000, random_state 42)
per layer; its held-out accuracy per layer. The sample sets are written in their JSON format, so their scripts and
this module can read the same file.

Their instruction, needle and question take 325-390 byte-level tokens (by the key), so their prompt with 4 noise
blocks is 710-775 tokens, beyond what a 512-token model was trained on: ``brief`` keeps their needle, noise blocks
and values and replaces the instruction and question with one short line that restates the needle up to the digit
that tells the values apart ("The magic number for {key} is: 3141592"), so that the probe stays within such a
model's training length and its last token is where a model that copies the value one token at a time predicts the
class (a deviation from their prompt, recorded in the record's ``template``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from hybrid_lightning.eval.scoring import autocast, evaluating
from hybrid_lightning.probes.haystack import NOISE
from hybrid_lightning.records import row

HARD_VALUES = tuple(f"3141592{i}" for i in range(8))  # their "hard" candidates: the class is the last digit
TEMPLATE = ("A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
            "about the number afterwards.\n{context}\nWhat is the special magic number for {query} mentioned in the "
            "provided text? The special magic number for {query} mentioned in the provided text is")
# ``brief``: the same needle and haystack, no instruction, the question the needle restated up to the class digit
BRIEF = "{context}\nThe magic number for {query} is: " + os.path.commonprefix(HARD_VALUES)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
FEATURES = ("residual", "delta")
SPLIT_SEED, TEST_SHARE = 42, 0.2  # their split and classifier seed


def prompt(key: str, value: str, blocks: int, at: int, brief: bool = False) -> str:
    """Their prompt (``brief``: without the instruction, one short question): ``blocks`` noise blocks, one per line,
    with the needle inserted before block ``at``."""
    lines = [NOISE] * blocks
    lines.insert(at, NEEDLE.format(key=key, value=value))
    return (BRIEF if brief else TEMPLATE).format(context="\n".join(lines), query=key)


def blocks_for(tok, length: int, brief: bool = False) -> int:
    """The most noise blocks whose prompt (with the longest key) fits ``length`` tokens; a ``ValueError`` if none."""
    from hybrid_lightning.probes.tasks import word_lists

    adjs, nouns = word_lists()
    key = f"{max(adjs, key=len)}-{max(nouns, key=len)}"
    lo, hi = 0, max(1, length)  # a block is at least one token
    while lo < hi:  # the largest n with len(prompt(n)) <= length
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(tok.encode(prompt(key, HARD_VALUES[0], mid, 0, brief))) <= length else (lo, mid - 1)
    if lo < 4:
        raise ValueError(f"--length {length}: too short for a probe of at least 4 noise blocks"
                         + ("" if brief else " (--brief drops the instruction and the long question)"))
    return lo


def make_probe_set(tok, samples: int, length: int, classes: int = 8, seed: int = 42, brief: bool = False) -> list[dict]:
    """``samples`` prompts of at most ``length`` tokens, rows in their JSON format (``id``, ``text``, ``label``,
    ``value``, ``key``, ...); labels uniform over the first ``classes`` values; ``brief``: see the module."""
    from hybrid_lightning.probes.tasks import word_lists

    if not 2 <= classes <= len(HARD_VALUES):
        raise ValueError(f"--classes {classes}: between 2 and {len(HARD_VALUES)}")
    adjs, nouns = word_lists()
    rng, blocks = np.random.default_rng(seed), blocks_for(tok, length, brief)
    rows = []
    for i in range(samples):
        key = f"{adjs[rng.integers(len(adjs))]}-{nouns[rng.integers(len(nouns))]}"
        label = int(rng.integers(classes))
        at = int(rng.integers(blocks // 4, blocks * 3 // 4 + 1))
        rows.append({"id": i, "text": prompt(key, HARD_VALUES[label], blocks, at, brief), "label": label,
                     "value": HARD_VALUES[label], "key": key, "haystack_type": "repeat", "num_classes": classes,
                     "difficulty": "hard", "depth": None, "depth_candidates": None})
    return rows


def read_probe_set(path: str | Path) -> list[dict]:
    """A probe set in their JSON format (a list of rows with ``text`` and ``label``)."""
    try:
        rows = json.loads(Path(path).read_text())
        assert all("text" in r and "label" in r for r in rows)
    except (OSError, ValueError, TypeError, AssertionError):
        raise ValueError(f"--data {path}: not a probe set (a JSON list of rows with 'text' and 'label')") from None
    return rows


@torch.no_grad()
def last_token_states(model, ids: torch.Tensor, chunk: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """ids (T,) -> (L + 1, D) float32: the embedding and each block's output at the last token (the residual
    stream, ``hidden_states`` of transformers without a final norm), the prompt fed in pieces of ``chunk`` tokens
    through the model's states. Forward hooks read the blocks; the model is unchanged."""
    found: list[torch.Tensor | None] = [None] * (len(model.layers) + 1)

    def keep(i):
        return lambda module, args, out: found.__setitem__(i, out[0, -1].float())

    hooks = [m.register_forward_hook(keep(i)) for i, m in enumerate([model.embed, *model.layers])]
    try:
        states = model.new_states()
        for s in range(0, ids.shape[0], chunk):
            with autocast(ids.device, dtype):
                model(ids[None, s : s + chunk], states)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(found)


def features(model, texts: list[np.ndarray], chunk: int, dtype: torch.dtype | None = None) -> np.ndarray:
    """(samples, L + 1, D) float32: ``last_token_states`` of each text (token ids)."""
    device = next(model.parameters()).device
    with evaluating(model):
        return np.stack([last_token_states(model, torch.as_tensor(np.asarray(t, np.int64), device=device), chunk,
                                           dtype).cpu().numpy() for t in texts])


def accuracy(X: np.ndarray, y: np.ndarray) -> tuple[float, int, int]:
    """Held-out accuracy of their classifier on features X (n, D) and labels y (n,): (accuracy, n_train, n_test)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import StandardScaler

    stratify = y if len(np.unique(y)) > 1 else None
    try:
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=TEST_SHARE, random_state=SPLIT_SEED,
                                                            stratify=stratify)
    except ValueError:  # a class too small to stratify: their fallback, an unstratified split
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=TEST_SHARE, random_state=SPLIT_SEED)
    scaler = StandardScaler().fit(X_train)
    clf = OneVsRestClassifier(LogisticRegression(solver="liblinear", C=0.1, max_iter=1000, random_state=SPLIT_SEED))
    clf.fit(scaler.transform(X_train), y_train)
    return float(clf.score(scaler.transform(X_test), y_test)), len(y_train), len(y_test)


def probe_rows(states: np.ndarray, labels: np.ndarray, mixers: list[str], part: str | None, tokens: int | None,
               step: int, seen: int) -> list[dict]:
    """The ``layer_probe`` rows: each layer's accuracy on its ``residual`` and ``delta`` features; ``states``
    (samples, L + 1, D) from ``features``, ``mixers`` the layers' mixers."""
    rows = []
    for i, mixer in enumerate(mixers):
        for feature in FEATURES:
            X = states[:, i + 1] if feature == "residual" else states[:, i + 1] - states[:, i]
            acc, n_train, n_test = accuracy(X, labels)
            rows.append(row("layer_probe", layers=part, receptive_field=tokens, step=step, tokens=seen, layer=i,
                            mixer=mixer, feature=feature, accuracy=acc, n_train=n_train, n_test=n_test,
                            classes=len(np.unique(labels))))
    return rows


def probe_checkpoint(run_dir: str | Path, limits: list[tuple[str, int]] = (), ckpt: str | Path | None = None,
                     data: str | Path | None = None, samples: int = 400, length: int | None = None, classes: int = 8,
                     seed: int = 42, write_data: str | Path | None = None, brief: bool = False) -> dict:
    """Layer-wise probes of a checkpoint of ``run_dir`` (``eval.offline.load_checkpoint``), unrestricted and under
    each of ``limits`` ((layers, R) pairs), on the probe set ``data`` (their JSON format) or one made here
    (``make_probe_set``: ``samples`` prompts of at most ``length`` tokens, default the run's ``train.seq_len``, their
    prompt or ``brief``),
    written to ``write_data`` when given; features in fp32, fed in pieces of ``eval.chunk_tokens``. Writes
    ``eval/layer_probe_step_<k>.json`` and returns it."""
    from hybrid_lightning.eval.offline import load_checkpoint
    from hybrid_lightning.model.restrict import applicable, receptive_field
    from hybrid_lightning.rundir.evals import write_eval_record

    run = load_checkpoint(run_dir, ckpt)
    tok = run.data.tokenizer
    probes = read_probe_set(data) if data else make_probe_set(tok, samples, length or run.cfg.train.seq_len,
                                                               classes, seed, brief)
    if write_data:
        Path(write_data).write_text(json.dumps(probes, indent=1))
    texts, labels = [tok.encode(r["text"]) for r in probes], np.array([int(r["label"]) for r in probes])
    mixers = [block.spec.mixer for block in run.model.layers]
    rows = []
    for part, tokens in [(None, None), *applicable(run.model, limits)]:
        with receptive_field(run.model, part, tokens):
            states = features(run.model, texts, run.cfg.eval.chunk_tokens)
        rows += probe_rows(states, labels, mixers, part, tokens, run.step, run.tokens)
    record = {"step": run.step, "tokens": run.tokens, "samples": len(probes), "data": str(data or write_data or ""),
              "prompt_tokens": int(max(map(len, texts))),
              "template": "file" if data else "brief" if brief else "authors", "layer_probe": rows}
    write_eval_record(Path(run_dir), "layer_probe", record,
                      {"layer_probe": ("layers", "receptive_field", "layer", "feature")})
    return record


def probe_table(record: dict) -> str:
    """Per layer (its mixer), the held-out accuracy of each feature, one column per restriction."""
    rows = record["layer_probe"]
    setups = list(dict.fromkeys((r["layers"], r["receptive_field"], r["feature"]) for r in rows))
    acc = {(r["layers"], r["receptive_field"], r["feature"], r["layer"]): r["accuracy"] for r in rows}
    names = [f"{f}" + (f" {p}:{t}" if p else "") for p, t, f in setups]
    lines = [f"step {record['step']}  {record['samples']} probes of up to {record['prompt_tokens']} tokens, "
             f"chance {1 / rows[0]['classes']:.3f}", f"{'layer':<16}" + "".join(f"{n:>20}" for n in names)]
    for layer, mixer in dict.fromkeys((r["layer"], r["mixer"]) for r in rows):
        lines.append(f"{f'{layer} {mixer}':<16}" + "".join(f"{acc[(*s, layer)]:>20.3f}" for s in setups))
    return "\n".join(lines)
