"""One command-line grammar: a grid command's positionals and options in any order, errors naming the flag and
the command that raised them, hints that say what will work, no library warning on the console, numbers for
people."""

import warnings

import pytest
import yaml

from conftest import REPO
from hybrid_lightning.cli import build_parser, main
from hybrid_lightning.config import validate_config
from hybrid_lightning.grid.report import _gpu_hours

GRID_COMMANDS = {  # each grid command with its options after its positionals
    "plan": (["--root", "R", "--json", "--set", "train.max_steps=2"], {"root": "R", "json": True}),
    "submit": (["--root", "R", "--executor", "local", "--parallel", "2"], {"executor": "local", "parallel": 2}),
    "status": (["--root", "R", "--cells", "seed=*", "--json"], {"cells": ["seed=*"], "json": True}),
    "tensorboard": (["--root", "R"], {"root": "R"}),
    "cancel": (["--root", "R", "b"], {"root": "R", "names": ["b"]}),
}


@pytest.mark.parametrize("command", sorted(GRID_COMMANDS))
def test_every_grid_command_takes_options_after_its_positionals(command):
    options, expected = GRID_COMMANDS[command]
    extra = ["a"] if command == "cancel" else []  # cells before and after the options
    args = build_parser().parse_args(["grid", command, "g.yaml", *extra, *options])
    assert args.grid == "g.yaml" and {k: getattr(args, k) for k in expected} == {
        **expected, **({"names": ["a", "b"]} if command == "cancel" else {})}


def test_grid_cancel_with_root_before_the_cells(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"axes": {"seed": [0, 1]}}))
    assert main(["grid", "cancel", str(grid), "--root", str(tmp_path / "runs"), "seed=1"]) == 0
    assert "grid g: cancelled 0 cell(s)" in capsys.readouterr().out
    assert main(["grid", "cancel", str(grid), "--root", str(tmp_path / "runs"), "seed=2"]) == 2
    assert capsys.readouterr().err.startswith("hybrid-lightning grid cancel: error: grid g: no cell named 'seed=2'")


def test_a_word_where_a_number_goes_is_told_to_give_a_number():
    for value, hint in (("big", 'not the string "big"; give a number'),
                        ("16", 'not the string "16"; write it without')):
        with pytest.raises(ValueError, match=hint):
            validate_config({"model": {"window": value}})


def test_gpu_hours_are_for_people():
    assert [_gpu_hours(h) for h in (2.48e-8, 0.0123, 1.234, 1234.5)] == ["<0.01", "0.0123", "1.23", "1,230"]


def test_grid_plan_verdicts_warns_nothing(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy or pandas warning fails the command
        assert main(["grid", "plan", str(REPO / "ablations" / "demo.yaml"), "--verdicts"]) == 0
    assert "RuntimeWarning" not in capsys.readouterr().err
