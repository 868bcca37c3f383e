"""The custom-scalars layout of a run's TensorBoard (its CUSTOM SCALARS tab, TensorBoard's ``custom_scalars``
plugin): a first page that leads with the headline, the charts of ``records.HEADLINE`` (the score within and
beyond the training length, the retrieval heads, the loss), one line per run. Every run writes it when training
starts (``callbacks.RunSummary``); TensorBoard merges the runs' layouts, so a grid's page holds every cell. An arm
of a grid with several seeds gets a run of its own, ``seeds/<arm>`` (grid/tensorboard.py), holding each headline
tag's mean, lowest and highest over the seeds under the tag with a suffix each (``SEED_STATS``), drawn as margin
charts; the cells' own runs hold none of those tags, so that TensorBoard lists none of them as missing a margin
(it lists a run that has some of a margin chart's three tags but not all)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

from hybrid_lightning.records import HEADLINE

HEADLINE_PAGE = "headline"
SEEDS_PAGE = "headline over seeds: mean, min and max"
SEED_STATS = ("_seed_mean", "_seed_min", "_seed_max")  # suffixes of the tags of an arm's mean, lowest and highest seed
PORT = 6006  # TensorBoard's default


def viewer_hint(logdir: Path, run: str | None = None) -> str:
    """The command that serves the runs under ``logdir`` and the address that opens on the headline page
    (CUSTOM SCALARS) rather than TensorBoard's first tab; with ``run``, the page shows that run alone (a filter
    of its run selector, which the reader can clear). A run directory is served from its parent folder, where
    TensorBoard names it after itself (served alone, it is named ".")."""
    url = f"http://localhost:{PORT}/#custom_scalars"
    if run is not None:
        url += "&regexInput=" + quote(f"^{re.escape(run)}$", safe="")
    return f"tensorboard --logdir {logdir}  # then open {url}"


def run_layout() -> dict:
    """The layout as ``SummaryWriter.add_custom_scalars`` takes it: the headline page of multiline charts."""
    return {HEADLINE_PAGE: {title: ["Multiline", [f"^{re.escape(tag)}$" for tag in tags]]
                            for title, tags in HEADLINE.items()}}


def seeds_layout() -> dict:
    """``run_layout`` and a page of margin charts, one per headline tag: an arm's mean over its seeds, its range
    shaded."""
    margins = {f"{title}: {tag}" if len(tags) > 1 else title: ["Margin", [tag + suffix for suffix in SEED_STATS]]
               for title, tags in HEADLINE.items() for tag in tags}
    return {**run_layout(), SEEDS_PAGE: margins}
