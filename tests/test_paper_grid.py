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
