"""``ablations/paper.yaml`` as the paper ran it: the full-attention model of each size S1-S4 has the released
non-embedding parameter count (github thunlp/rethinking-hybrid-attention, ``src/scaling/data/swa128_longppl.tsv``)
within 1%, as ``hybrid-lightning params`` prints it."""

import re

import pytest

from conftest import REPO
from hybrid_lightning.cli import main
from hybrid_lightning.config import read_text_file, read_yaml

RELEASED = {"S1": 14_999_424, "S2": 31_470_080, "S3": 64_901_760, "S4": 104_427_264}  # the table's column n


@pytest.mark.parametrize("size", sorted(RELEASED))
def test_the_full_attention_model_of_each_size_has_the_released_count(size, capsys):
    path = REPO / "ablations" / "paper.yaml"
    grid = read_yaml(read_text_file(path, "grid file"), path)
    settings = [f"{key}={value}" for key, value in {**grid["axes"]["arch"]["full"],
                                                      **grid["axes"]["size"][size]}.items()]
    assert main(["params", *(a for s in settings for a in ("--set", s))]) == 0
    count = int(re.search(r"^non-embedding ([\d,]+)", capsys.readouterr().out, re.M)[1].replace(",", ""))
    assert abs(count - RELEASED[size]) / RELEASED[size] < 0.01, (size, count)


@pytest.mark.slow
def test_planning_the_paper_grid_takes_seconds_of_cpu(tmp_path):
    """All 360 cells planned (parameters, FLOPs, memory on fake tensors, start checks): 21.9 s of CPU on a quiet
    2-core machine (docs/training.md); it took 212 s when each cell walked the standard library for the embedded
    corpus. The bound leaves room for a busier machine."""
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "hybrid_lightning", "grid", "plan", str(REPO / "ablations" / "paper.yaml"),
               "--root", str(tmp_path)]
    r = subprocess.run(command, capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert r.returncode == 0 and "360 cells" in r.stdout, r.stderr[-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 40, cpu
