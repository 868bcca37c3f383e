"""Run directories into tidy tables. Reads only the run-directory contract (docs/run-directory.md;
its paths and readers are ``hybrid_lightning.rundir``'s): ``config.yaml`` with its provenance, the run
plan (``plan.json``: the layers, parameter counts and tokens; ``rundir.files.read_plan``), ``status.json``, the
TensorBoard scalars and ``eval/*.json``. An architecture is what the plan says, not how the config spelled
it: ``SSSF`` and ``EEEF`` with ``model.mixer: swa`` are one.

    runs = load_runs(find_runs("runs/window-nope"))
    runs.metrics   # one row per run x step x metric, with the varying config values as columns
    runs.configs   # one row per run: every flattened config key, state, architecture and label
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from hybrid_lightning.analysis.scalars import TAGS, missing_scalars, read_scalars, scalar_records
from hybrid_lightning.analysis.scores import record_scores
from hybrid_lightning.config import PROVENANCE_KEY, flatten
from hybrid_lightning.config.roles import is_identity
from hybrid_lightning.kinds import FULL, KINDS
from hybrid_lightning.records import Tag, columns
from hybrid_lightning.rundir import (
    CONFIG_FILE,
    DATA_KEY,
    eval_files,
    find_runs,  # noqa: F401 (re-exported: load_runs(find_runs(root)))
)
from hybrid_lightning.rundir.evals import read_eval_record
from hybrid_lightning.rundir.files import read_config_dict, read_plan
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.runplan import LAYOUT_KEYS, RunPlan

HEAD_TOTALS = ("retrieval_heads", "copy_heads", "max_score", "mean_score")  # of heads_step_<k>.json "total"
PARAM_FIELDS = ("embedding", "non_embedding", "total")  # the plan's parameter counts
PARAM_COLUMNS = tuple(f"{f}_params" for f in PARAM_FIELDS)
# configs' own columns
RUN_COLUMNS = ("run", "path", "state", "status_step", "tokens_per_step", "eval_files", "mixers", "windowed",
               "windowed_hybrid", "full_layers", *PARAM_COLUMNS)
# Labels name the config keys that differ between the runs loaded, these three by a short name or none.
LABEL_NAMES = {"model.mixer": "", "model.window": "W", "model.pattern": ""}
LABEL_MAX, VALUE_MAX = 48, 16  # characters of a label and of one value in it (legends stay readable)


@dataclass(frozen=True)
class Runs:
    """Everything ``load_runs`` read; every table has a ``run`` column (the run's path relative to the root).

    configs: one row per run: ``run``, ``path``, ``state`` (status.json; ``no status.json`` without one),
        ``status_step``, ``tokens_per_step`` (the plan's), ``arch`` (the identity, ``_identity``, as JSON),
        ``label`` (readable ``arch``), ``eval_files``, from the plan ``mixers`` (the efficient mixers,
        ``+``-joined), ``windowed`` (a layer attends within a window), ``windowed_hybrid`` (full layers
        beside windowed ones only), ``full_layers`` (their indices, comma-joined), ``embedding_params``,
        ``non_embedding_params``, ``total_params`` (missing for older runs that did not record them), and every
        flattened config key (provenance left out; ``data.files`` is the provenance's data fingerprint where it
        has one, so that runs of the same data trained from other folders are alike).
    metrics: run, step, tokens, metric, value, then ``label``, ``seed`` and the config keys that
        differ between runs. Metrics: the TensorBoard ``TAGS``, ``heads/<HEAD_TOTALS>`` and the
        long-context scores ``longctx/<score>`` and ``longctx/<score>_beyond`` (analysis/scores.py).
    records: the long-context records of eval/step_<k>.json (docs/run-directory.md), one row per run x record.
    heads: the per-head rows of eval/heads_step_<k>.json, one row per run x step x head.
    layers: the per-layer rows of eval/heads_step_<k>.json (``applicable`` false: not attention).
    ablations: the head-ablation rows of eval/heads_step_<k>.json (``hybrid-lightning heads --mask-*``).
    selections: the held-out scores that chose the heads an ablation masked (a heads file's ``selection``):
        run, step, seed (the probe seed), layer, head, score.
    """

    configs: pd.DataFrame
    metrics: pd.DataFrame
    records: pd.DataFrame
    heads: pd.DataFrame
    layers: pd.DataFrame
    ablations: pd.DataFrame
    selections: pd.DataFrame

    def without(self, runs: set[str]) -> Runs:
        """The same tables without the rows of ``runs`` (their ``run`` names)."""
        return Runs(*(t[~t["run"].isin(runs)] if "run" in t else t
                      for t in (getattr(self, f.name) for f in fields(self))))


SELECTION_COLUMNS = ["run", "step", "seed", "layer", "head", "score"]


def flat_config(d: dict) -> dict:
    """A config as dotted keys (``config.flatten``); lists become their JSON text so that they can be compared."""
    return {k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v for k, v in flatten(d).items()}


def read_evals(run_dir: Path) -> tuple[list[dict], ...]:
    """(long-context records, head totals with step and tokens, head rows, layer rows, ablation rows, selection
    rows) of eval/*.json."""
    records, totals, heads, layers, ablations, selections = [], [], [], [], [], []
    for kind, _, path in eval_files(run_dir):
        report = read_eval_record(path)
        if not _readable(kind, report):  # written whole or not at all: damaged
            print(f"analyze: skipping {path}: it does not read as an evaluation record (damaged)", file=sys.stderr)
            continue
        if kind == "heads":
            totals.append({"step": report["step"], "tokens": report["tokens"], **report["total"]})
            heads += report["heads"]
            layers += report["layers"]
            ablations += report.get("ablation", [])
            chosen = report.get("selection") or {}
            selections += [{"step": report["step"], "seed": chosen.get("seed"), **h} for h in chosen.get("heads", [])]
        elif kind == "longctx":
            records += report["records"]
    return records, totals, heads, layers, ablations, selections


def _readable(kind: str, report) -> bool:
    needed = {"heads": ("step", "tokens", "total", "heads", "layers"),
              "longctx": ("step", "tokens", "records")}.get(kind, ("step", "tokens", kind))
    return isinstance(report, dict) and all(k in report for k in needed)


def _read_config(run_dir: Path) -> dict:
    """config.yaml with its provenance; a ``ValueError`` naming it where it is cut short."""
    config = read_config_dict(run_dir) or {}
    if PROVENANCE_KEY not in config:  # training writes it last: a file without it was cut short
        raise ValueError(f"{Path(run_dir) / CONFIG_FILE}: no {PROVENANCE_KEY} section, which training writes last: "
                         "the file is cut short; train the run again (same command) to rewrite it")
    return config


def damaged_records(run_dir: Path) -> list[str]:
    """What of a run directory's records does not read as analysis reads it (config.yaml, plan.json, status.json,
    eval/*.json, a packed run's scalars.csv), each as 'path: why'; empty for a sound run."""
    found = []
    for check in (_read_config, read_plan):
        try:
            check(run_dir)
        except ValueError as e:
            found.append(str(e))
    if (read_status(run_dir) or {}).get("state") == "damaged":
        found.append(read_status(run_dir)["error"])
    found += [f"{path}: not an evaluation "
              "record" for kind, _, path in eval_files(run_dir) if not _readable(kind, read_eval_record(path))]
    scalars, damaged = scalar_records(run_dir)
    return found + damaged + missing_scalars(run_dir, read_status(run_dir) or {}, scalars)


def _read_run(run_dir: Path, tags: tuple[str, ...]) -> dict:
    config = _read_config(run_dir)
    status = read_status(run_dir) or {}
    if status.get("state") == "damaged":
        print(f"analyze: {status['error']}; the run counts as not done", file=sys.stderr)
    provenance = config.pop(PROVENANCE_KEY, None) or {}
    records, totals, heads, layers, ablations, selections = read_evals(run_dir)
    flat = flat_config(config)
    if provenance.get(DATA_KEY):  # the data by its fingerprint, not by where its files were on the machine that trained
        flat["data.files"] = json.dumps(provenance[DATA_KEY], sort_keys=True)
    scalars = read_scalars(run_dir, tags)
    for line in missing_scalars(run_dir, status, scalars):
        print(f"warning: {line}", file=sys.stderr)
    return {"config": flat, "plan": read_plan(run_dir), "status": status,
            "scalars": scalars, "records": records, "totals": totals, "heads": heads,
            "layers": layers, "ablations": ablations, "selections": selections}


def load_runs(dirs: Iterable[str | Path], root: str | Path | None = None, tags: Iterable[str] = TAGS,
              workers: int = 1) -> Runs:
    """Reads run directories into tidy tables (see ``Runs``).

    Args:
        dirs: run directories (folders holding config.yaml), e.g. ``find_runs(root)``.
        root: run names are paths relative to it; default the runs' common parent.
        tags: TensorBoard scalar tags to read (``train/tokens`` is always read, for the tokens of each step).
        workers: processes reading runs at once (TensorBoard parsing is the slow part).
    """
    dirs = [Path(d).absolute() for d in dirs]
    for d in dirs:
        if not (d / CONFIG_FILE).is_file():
            raise ValueError(f"dirs: {d} holds no {CONFIG_FILE}; is it a run directory?")
    root = Path(root).absolute() if root is not None else _common_parent(dirs)
    tags = tuple(dict.fromkeys([*tags, Tag.TOKENS]))
    if workers > 1 and len(dirs) > 1:
        with ProcessPoolExecutor(workers) as pool:
            raw = list(pool.map(_read_run, dirs, [tags] * len(dirs), chunksize=max(1, len(dirs) // (4 * workers))))
    else:
        raw = [_read_run(d, tags) for d in dirs]
    names = [d.relative_to(root).as_posix() if d != root else d.name for d in dirs]
    configs = _configs(names, dirs, raw)
    return Runs(configs, *_tables(names, raw, configs))


def planned_configs(cells: list[tuple[str, dict, RunPlan]]) -> pd.DataFrame:
    """``Runs.configs`` of runs not trained yet, a grid's cells as (name, config as plain data, plan): the same
    architectures and labels analysis will give their runs (state ``planned``)."""
    raw = [{"config": flat_config(config), "plan": plan, "status": {"state": "planned"}, "records": [], "totals": []}
           for _, config, plan in cells]
    return _configs([name for name, _, _ in cells], [Path(name) for name, _, _ in cells], raw)


def _common_parent(dirs: list[Path]) -> Path:
    return Path(os.path.commonpath([d.parent for d in dirs])) if dirs else Path.cwd()


def _configs(names: list[str], dirs: list[Path], raw: list[dict]) -> pd.DataFrame:
    """One row per run; see ``Runs.configs``."""
    rows = []
    for name, path, r in zip(names, dirs, raw):
        plan: RunPlan = r["plan"]
        params = {column: (plan.params or {}).get(f) for column, f in zip(PARAM_COLUMNS, PARAM_FIELDS)}
        rows.append({"run": name, "path": str(path), "state": r["status"].get("state", "no status.json"),
                     "status_step": r["status"].get("step"), "tokens_per_step": float(plan.budget.tokens_per_step),
                     "eval_files": bool(r["records"] or r["totals"]), "mixers": "+".join(plan.mixers),
                     "windowed": bool(plan.windows), "windowed_hybrid": plan.windowed_hybrid,
                     "full_layers": ",".join(map(str, plan.full_layers)), **params, **r["config"]})
    configs = pd.DataFrame(rows)
    if configs.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "arch", "label", "seed"])
    identities = [_identity(row, r["plan"]) for row, r in zip(configs.to_dict("records"), raw)]
    configs["arch"] = [json.dumps(i, sort_keys=True, default=str) for i in identities]
    configs["label"] = _labels(identities, [r["plan"] for r in raw])
    return configs


def _identity(cfg: dict, plan: RunPlan) -> dict:
    """What makes an architecture (and budget): the config keys whose role tells architectures apart
    (``hybrid_lightning.config.roles.is_identity``: no seed, bookkeeping or evaluation keys), with the model's
    layout from the plan (``RunPlan.layout``) in place of the config's spelling of it, and the options section of a
    mixer the plan does not use left out."""
    unused = [KINDS[m].section for m in KINDS if KINDS[m].section and m not in plan.mixers]
    layout = plan.layout()
    out = {}
    # the config's order; the layout keys first where it lacks them
    for k, v in {**dict.fromkeys(LAYOUT_KEYS), **cfg}.items():
        if k in LAYOUT_KEYS:
            if k in layout:
                out[k] = layout[k]
        elif is_identity(k) and k not in RUN_COLUMNS and not any(k.startswith(f"model.{s}.") for s in unused):
            out[k] = None if isinstance(v, float) and pd.isna(v) else v  # a key other runs have and this one lacks
    return out


def _labels(identities: list[dict], plans: list[RunPlan]) -> list[str]:
    """One label per run (``_label``), from the keys that differ between the runs: those with two values or
    more among the runs that have them (a key a run lacks does not apply to it). Distinct architectures
    whose labels would coincide once shortened name the keys that differ among them first, after the mixer,
    window and pattern (``lightning EEEF max_steps=6000 pos.full=rope…``); where that does not tell them
    apart either, they keep their label with a 4-character hash of their identity appended. Where no key
    differs, the label names the model (``_model``)."""
    archs = [json.dumps(i, sort_keys=True, default=str) for i in identities]
    varying = _varying(identities)
    labels = _texts(identities, plans, varying, identities)
    for label in _shared(labels, archs):
        group = [i for i, text in enumerate(labels) if text == label]
        first = _varying([identities[i] for i in group])
        again = _texts([identities[i] for i in group], [plans[i] for i in group],
                       first + [k for k in varying if k not in first], identities)
        if not _shared(again, [archs[i] for i in group]):
            for i, text in zip(group, again):
                labels[i] = text
    shared = _shared(labels, archs)
    return [f"{label} #{hashlib.sha1(a.encode()).hexdigest()[:4]}" if label in shared else label
            for label, a in zip(labels, archs)]


def _varying(identities: list[dict]) -> list[str]:
    """The keys with two values or more among the runs that have them, in the order the runs name them."""
    keys = list(dict.fromkeys(k for i in identities for k in i))
    return [k for k in keys if len({json.dumps(i[k], default=str) for i in identities if k in i}) > 1]


def _texts(identities: list[dict], plans: list[RunPlan], keys: list[str], among: list[dict]) -> list[str]:
    """The labels of ``identities`` naming ``keys`` (in that order, after those of ``LABEL_NAMES``); values
    shortened as among the runs ``among``, so that one value reads the same in every label."""
    names = _short_names(keys)
    shown = {k: _distinct_parts([i[k] for i in among if i.get(k) is not None]) for k in names}
    return [_label({k: shown[k][v] for k, v in i.items() if k in shown and v is not None}, names) or _model(i, plan)
            for i, plan in zip(identities, plans)]


def _shared(labels: list[str], archs: list[str]) -> set[str]:
    """The labels that more than one architecture has."""
    by_label: dict[str, set[str]] = {}
    for label, a in zip(labels, archs):
        by_label.setdefault(label, set()).add(a)
    return {label for label, kinds in by_label.items() if len(kinds) > 1}


def _short_names(varying: list[str]) -> dict[str, str]:
    """Varying key -> its name in labels: ``W`` for the window, nothing for the mixer and the pattern (their
    value says what they are), else the key without its section (``pos.full``, ``lr``), or the whole key
    where two keys would share a name. In the order mixer, window, pattern, then the config's."""
    first = [k for k in LABEL_NAMES if k in varying]
    rest = [k for k in varying if k not in LABEL_NAMES]
    short = {k: k.split(".", 1)[-1] for k in rest}
    return {**{k: LABEL_NAMES[k] for k in first},
            **{k: name if list(short.values()).count(name) == 1 else k for k, name in short.items()}}


def _label(values: dict[str, str], names: dict[str, str]) -> str:
    """E.g. ``W=128 pos.full=nope``: the keys in ``names`` that this run has (``values``: key -> its text), as
    ``name=value`` (the value alone where the name is empty), at most ``LABEL_MAX`` characters."""
    label = " ".join(f"{name}={values[k]}" if name else values[k] for k, name in names.items() if k in values)
    return label if len(label) <= LABEL_MAX else label[:LABEL_MAX - 1].rstrip() + "…"


def _model(identity: dict, plan: RunPlan) -> str:
    """The label where no key differs: the mixers (``full`` for none), the window, the pattern (``swa W=128
    EEEF``)."""
    window = [f"W={identity['model.window']}"] if plan.windows else []
    return " ".join(["+".join(plan.mixers) or FULL, *window, plan.pattern])


def _distinct_parts(values: list) -> dict:
    """Value -> its text in labels: floats as ``%g``; paths without the leading and trailing folders all of
    them share (``/data/a/train.jsonl``, ``/data/b/train.jsonl``: ``a``, ``b``); at most ``VALUE_MAX``
    characters."""
    texts = {v: f"{v:g}" if isinstance(v, float) else str(v) for v in dict.fromkeys(values)}
    if len(texts) > 1 and all("/" in t for t in texts.values()):
        parts = [t.strip("/").split("/") for t in texts.values()]
        head = len(os.path.commonprefix(parts))
        tail = len(os.path.commonprefix([p[head:][::-1] for p in parts]))
        texts = {v: "/".join(p[head:len(p) - tail]) or p[-1] for v, p in zip(texts, parts)}
    return {v: t if len(t) <= VALUE_MAX else t[:VALUE_MAX - 1] + "…" for v, t in texts.items()}


def _tables(names: list[str], raw: list[dict], configs: pd.DataFrame) -> tuple[pd.DataFrame, ...]:
    """(metrics, records, heads, layers, ablations, selections) of all runs; see ``Runs``."""
    frames, records, heads, layers, ablations, selections = [], [], [], [], [], []
    for name, r in zip(names, raw):
        scalars = r["scalars"][r["scalars"]["metric"] != Tag.TOKENS]
        # steps as the run recorded them (an older run's by index), tokens of the optimizer steps completed by then
        frames.append(scalars.assign(run=name, tokens=r["plan"].tokens_at_recorded(scalars["step"])))
        if r["totals"]:
            totals = pd.DataFrame(r["totals"]).melt(["step", "tokens"], list(HEAD_TOTALS), "metric", "value")
            frames.append(totals.assign(run=name, metric="heads/" + totals["metric"]))
        records.append(pd.DataFrame(r["records"]).assign(run=name))
        heads.append(pd.DataFrame(r["heads"]).assign(run=name))
        layers.append(pd.DataFrame(r["layers"]).assign(run=name))
        ablations.append(pd.DataFrame(r["ablations"]).assign(run=name))
        selections.append(pd.DataFrame(r["selections"]).assign(run=name))
    records = _concat(records, ["run", *columns("records")])
    frames.append(record_scores(records, pd.Series({name: r["plan"].budget.seq_len for name, r in zip(names, raw)})))
    metrics = _concat(frames, ["run", "step", "tokens", "metric", "value"])[
        ["run", "step", "tokens", "metric", "value"]]
    metrics = metrics.astype({"step": "int64", "tokens": "float64", "value": "float64"})
    metrics = metrics.sort_values(["run", "metric", "step"], kind="stable").reset_index(drop=True)
    varying = [k for k in configs.columns
               if k not in {*RUN_COLUMNS, "arch", "label", "seed", "name"} and configs[k].astype(str).nunique() > 1]
    keep = ["label", "seed", *varying] if len(configs) else []
    metrics = metrics.merge(configs[["run", *keep]], on="run", how="left")
    return (metrics,
            records,
            _concat(heads, ["run", *columns("heads")]),
            _concat(layers, ["run", *columns("layers")]),
            _concat(ablations, ["run", *columns("ablation")]),
            _concat(selections, SELECTION_COLUMNS))


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
