"""What TensorBoard shows, read through a real TensorBoard server's HTTP API: the custom-scalars layout whose first
page is the headline, no ``epoch`` scalar, tag groups ordered training, validation, the long-context headline, the
heads, then the per-task detail; per-layer head cards only for layers that have scored; the resolved config as
text, images no wider than their cards, an HParams session for a plain ``train`` run and for every grid cell with
the keys a study varies as written, and no stray run ``.`` at a grid's root."""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import TINY
from hybrid_lightning.config import load_config
from hybrid_lightning.eval.report import CARD_PX
from hybrid_lightning.grid import load_grid
from hybrid_lightning.grid.tensorboard import write_hparams
from hybrid_lightning.records import HEADLINE, HEADS_TAGS, LONGCTX_TAGS, TASKS_TAGS
from hybrid_lightning.training.hparams import HPARAMS_METRICS, STUDY_KEYS
from hybrid_lightning.training.layout import viewer_hint
from hybrid_lightning.training.run import train
from test_grid import write_grid


class Server:
    def __init__(self, logdir: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(logdir),
                                      "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def get(self, route: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + route, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def wait_for(self, runs: set[str], timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if runs <= set(self.get("/data/runs")):
                    return
            except OSError:
                pass
            assert time.time() < deadline and self.proc.poll() is None, "TensorBoard did not list the runs"
            time.sleep(1)


def test_tensorboard_shows_the_config_hparams_for_every_run_and_no_stray_root(tmp_path):
    evaluations = ["eval.every_n_steps=0", "eval.tasks=[passkey]", "eval.lengths=[256]", "eval.position_sequences=0",
                   "eval.heads.every_n_steps=0", "eval.heads.tasks=[passkey]", "eval.heads.lengths=[512]"]
    cfg = load_config(None, [*TINY[1::2], *evaluations, "train.max_steps=3", "train.warmup_steps=0", "seed=7"])
    train(cfg, tmp_path / "plain")
    arms = {"full": {"model.pattern": "F"}, "w8": {"model.window": 8}, "w16": {"model.window": 16}}
    grid = load_grid(write_grid(tmp_path, axes={"arch": arms}))  # sessions only: nothing trained
    write_hparams(grid)
    server = Server(tmp_path)
    cells = [f"runs/g/{c.name}" for c in grid.cells]
    try:
        server.wait_for({"plain", *cells})
        assert set(server.get("/data/runs")) == {"plain", *cells}  # no "." nor "runs/g" at the grid's root
        # the address a run prints opens on the headline page showing that run alone
        url = viewer_hint(tmp_path, "plain").split("then open ")[1]
        assert url.startswith("http://localhost:6006/#custom_scalars&regexInput=")
        only = urllib.parse.unquote(url.split("regexInput=")[1])
        assert [run for run in server.get("/data/runs") if re.search(only, run)] == ["plain"]
        tags = server.get("/data/plugin/scalars/tags")["plain"]
        assert "train/loss" in tags and "val/loss" in tags and "epoch" not in tags
        # TensorBoard shows tag groups (the part before the first "/") in name order: training and
        # validation first, then the probes' scores, then the per-layer head cards, all in one group
        images = server.get("/data/plugin/images/tags")["plain"]
        groups = sorted({tag.split("/")[0] for tag in [*tags, *images]})
        assert groups == ["train", "val", LONGCTX_TAGS, HEADS_TAGS, TASKS_TAGS], groups
        heads = json.loads(next((tmp_path / "plain" / "eval").glob("heads_step_*.json")).read_text())
        scored = {f"layer_{r['layer']:02d}" for r in heads["layers"] if (r["max_score"] or 0) > 0}
        assert {t.split("/")[1] for t in tags if t.startswith(f"{HEADS_TAGS}/layer_")} == scored
        layout = server.get("/data/plugin/custom_scalars/layout")
        assert layout["category"][0]["title"] == "headline"
        assert [c["title"] for c in layout["category"][0]["chart"]] == list(HEADLINE)
        assert server.get("/data/plugin/text/tags") == {"plain": ["config/text_summary"]}
        text = server.get("/data/plugin/text/text?run=plain&tag=config/text_summary")[0]["text"]
        assert "window: 32" in text and "seed: 7" in text
        for tag in ("val_longctx/heatmap", "val_longctx_heads/scores"):  # images no wider than their cards
            query = server.get(f"/data/plugin/images/images?run=plain&tag={urllib.parse.quote(tag)}")[-1]["query"]
            with urllib.request.urlopen(f"{server.base}/data/plugin/images/individualImage?{query}", timeout=10) as r:
                png = r.read()
            assert int.from_bytes(png[16:20], "big") <= CARD_PX, tag  # the PNG header's width
        _check_session_groups(server, cells)
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)
    server = Server(grid.root)  # the grid alone: its experiment
    try:
        server.wait_for({c.name for c in grid.cells})
        experiment = server.get("/data/plugin/hparams/experiment", {"experimentName": ""})
        # every key some arm has
        assert sorted(h["name"] for h in experiment["hparamInfos"]) == sorted(["arch", *STUDY_KEYS])
        differing = {h["name"] for h in experiment["hparamInfos"] if h.get("differs")}
        assert differing == {"arch", "model.pattern", "model.window", "seed"}  # the dashboard shows these first
        assert [m["name"]["tag"] for m in experiment["metricInfos"]] == list(HPARAMS_METRICS)
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def _check_session_groups(server: Server, cells: list[str]) -> None:
    """The HParams dashboard's sessions: the plain run's and each grid cell's study keys, and its loss."""
    # two experiment summaries here (the plain run's and the grid's): TensorBoard takes one, either holds these
    groups = server.get("/data/plugin/hparams/session_groups", {
        "experimentName": "", "startIndex": 0, "sliceSize": 100,
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [{"hparam": k} for k in STUDY_KEYS] + [{"metric": {"group": "", "tag": "train/loss"}}],
    })["sessionGroups"]
    by_name = {g["name"]: g["hparams"] for g in groups}
    assert by_name["plain"] == {"model.pattern": "EF", "model.mixer": "swa", "model.window": "32",
                                "model.pos.full": "rope", "model.pos.efficient": "rope", "seed": "7"}
    full, w8, w16 = (by_name[name] for name in cells)
    assert {k: full[k] for k in STUDY_KEYS if k in full} == {"model.pattern": "F", "model.pos.full": "rope",
                                                             "seed": "0"}
    assert (w8["model.window"], w16["model.window"]) == ("8", "16")  # as written; no mixer nor window for full
    loss = next(m for g in groups if g["name"] == "plain" for m in g["metricValues"]
                if m["name"]["tag"] == "train/loss")
    assert loss["trainingStep"] == 3
