"""Probes as an lm-evaluation-harness task: ``hybrid-lightning export --probes FILE`` writes
``<out>/lm_eval/``, a folder for ``lm_eval --include_path``.

One ``generate_until`` task per probe task (``<group>_<task>``) scored by lm-evaluation-harness's own
``exact_match``, and a group ``<group>`` averaging them over all probes. The prompt is the probe's text
without its answer; the model generates greedily as many tokens as the answer takes (``max_gen_toks``),
stopping at the end-of-document token, exactly as the tests' greedy scoring (``tests/greedy.py``) does.
A task whose answers differ in token count is split by that count (``<group>_<task>_<n>tok``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import yaml

GROUP = "hybrid_probes"
METRIC = {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}


def write_probe_tasks(rows: list[dict], tokenizer, out: Path, group: str = GROUP) -> list[str]:
    """Writes the task files of probes ``rows`` (``probes.files.read_probes``) into ``out``; ``tokenizer``
    (the run's) counts the answers' tokens. Returns the task names, the group last."""
    by_task: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_task[row["task"]][len(tokenizer.encode(row["answer"]))].append(row)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for task, by_count in by_task.items():
        for n, docs in sorted(by_count.items()):
            name = f"{group}_{task}" if len(by_count) == 1 else f"{group}_{task}_{n}tok"
            data = (out / f"{name}.jsonl").resolve()
            data.write_text("".join(json.dumps({k: d[k] for k in ("prompt", "answer", "task", "length", "depth")})
                                    + "\n" for d in docs))
            (out / f"{name}.yaml").write_text(yaml.safe_dump({
                "task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", "output_type": "generate_until", "doc_to_text": "prompt",
                "doc_to_target": "answer", "target_delimiter": "",
                "generation_kwargs": {"until": [], "max_gen_toks": n, "do_sample": False},
                "metric_list": [METRIC], "metadata": {"version": 1},
            }, sort_keys=False))
            names.append(name)
    (out / f"{group}.yaml").write_text(yaml.safe_dump({
        "group": group, "task": names,
        "aggregate_metric_list": [{"metric": "exact_match", "aggregation": "mean", "weight_by_size": True}],
        "metadata": {"version": 1},
    }, sort_keys=False))
    return names + [group]
