import pytest
import yaml

from conftest import run_cli
from hybrid_lightning.config import load_config, validate_config
from hybrid_lightning.plan import layer_plan


def test_empty_config_is_the_embedded_default():
    cfg = validate_config({})
    assert cfg.model.pattern == "EEEF" and cfg.model.mixer == "swa"
    assert cfg.data.files == () and cfg.data.hub is None


def test_unknown_key_suggests_closest():
    with pytest.raises(ValueError, match=r"unknown config key 'model.windw'.*did you mean 'model.window'"):
        validate_config({"model": {"windw": 3}})
    with pytest.raises(ValueError, match=r"unknown config key 'trian'.*did you mean 'train'"):
        validate_config({"trian": {}})


def test_overrides_are_typed_and_nested(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"window": 16}}))
    cfg = load_config(path, ["train.lr=3e-4", "model.pos.full=nope", "model.window=8", "data.files=null"])
    assert cfg.train.lr == 3e-4 and cfg.model.pos.full == "nope" and cfg.model.window == 8
    assert cfg.name == "c"


def test_pattern_tiles_and_mixes():
    cfg = validate_config({"model": {"pattern": "EEEF", "n_layers": 8}}).model
    assert "".join(s.letter for s in layer_plan(cfg)) == "SSSFSSSF"
    cfg = validate_config({"model": {"pattern": "SFSF", "n_layers": 4, "pos": {"full": "nope"}}}).model
    plan = layer_plan(cfg)
    assert [s.pos for s in plan] == ["rope", "nope", "rope", "nope"]
    assert [s.window for s in plan] == [64, None, 64, None]


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"model": {"pattern": "EXF"}}, "model.pattern"),
        ({"model": {"pattern": "EEF", "n_layers": 4}}, "model.pattern"),
        ({"model": {"mixer": "rwkv"}}, "model.mixer"),
        ({"model": {"window": 0}}, "model.window"),
        ({"model": {"d_model": 100, "n_heads": 3}}, "model.n_heads"),
        ({"model": {"n_heads": 4, "n_kv_heads": 3}}, "model.n_kv_heads"),
        ({"model": {"pos": {"full": "alibi"}}}, "model.pos.full"),
        ({"train": {"precision": "fp8"}}, "train.precision"),
    ],
)
def test_bad_values_name_the_field(raw, field):
    with pytest.raises(ValueError) as e:
        validate_config(raw)
    assert field in str(e.value)


@pytest.mark.slow
def test_bad_input_on_the_command_line_leaves_no_run_dir(tmp_path):
    cases = [
        (["--set", "model.windw=3"], "did you mean 'model.window'"),
        (["--set", "model.pattern=EQF"], "unknown letter 'Q'"),
        (["--set", "model.mixer=rwkv"], "accepted mixers"),
        (["--set", "model.window=0"], "model.window"),
        (["--set", "model.d_model=100", "--set", "model.n_heads=3"], "model.n_heads=3 must divide"),
        (["--set", "model.n_kv_heads=3"], "model.n_kv_heads=3 must divide"),
        (["--set", f"data.files=[{tmp_path / 'missing.txt'}]"], "data.files"),
    ]
    for i, (args, message) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        r = run_cli("train", "--run-dir", str(run_dir), *args, timeout=120)
        assert r.returncode == 2, r.stderr
        assert message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not run_dir.exists()


def test_relative_data_paths_are_taken_from_the_config_files_folder(tmp_path):
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "run.yaml"
    path.write_text("data: {files: [../data/a.txt], text_val_files: ../data/held_out.txt}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "held_out.txt").write_text("held-out text, which a grid's cells check before they train\n")
    data = load_config(path).data
    assert data.files == (str(tmp_path / "data" / "a.txt"),)
    assert data.text_val_files == (str(tmp_path / "data" / "held_out.txt"),)
    grid = tmp_path / "configs" / "g.yaml"
    grid.write_text("base: {data: {text_val_files: [../data/held_out.txt]}}\naxes: {seed: [0]}\n")
    from hybrid_lightning.grid import load_grid

    cell = load_grid(grid, tmp_path / "root").cells[0]
    assert cell.config.data.text_val_files == (str(tmp_path / "data" / "held_out.txt"),)
