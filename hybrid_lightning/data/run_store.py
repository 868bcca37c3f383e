"""The token store as a run takes it (data/store.py): prepared when missing and checked to fit the run and to be
the data it recorded (``ensure_store``, by ``train``), or the same refusals read only, writing nothing
(``check_store``, by the previews through ``training/preflight.py``)."""

from __future__ import annotations

from hybrid_lightning.config import RunConfig
from hybrid_lightning.data.corpus import check_sources
from hybrid_lightning.data.integrity import check_same_data, fingerprint
from hybrid_lightning.data.store import Store, check_fits, locate, open_store, read_whole
from hybrid_lightning.data.store_folder import refuse_foreign


def _for_run(cfg: RunConfig, recorded: dict | None):
    """The check a run makes of its store's manifest: a window of ``train.seq_len + 1`` tokens in each split and,
    when the run ``recorded`` a ``fingerprint``, that data (a difference is refused, naming what differs)."""

    def check(manifest: dict) -> None:
        check_fits(manifest, cfg.train.seq_len)
        check_same_data(recorded, fingerprint(manifest))

    return check


def ensure_store(cfg: RunConfig, recorded: dict | None = None) -> Store:
    """The run's store, prepared when missing, and checked (``_for_run``); a store this call would prepare is
    refused before it is published, and removed. ``train`` calls it before the run directory exists."""
    return open_store(cfg.data, check=_for_run(cfg, recorded))


def check_store(cfg: RunConfig, recorded: dict | None = None) -> None:
    """What ``ensure_store`` refuses that can be known without preparing: the sources (``check_sources``), a
    ``data.store`` that is someone else's folder and, where the store is prepared already, the run's check of it.
    Nothing is written."""
    check_sources(cfg.data)
    _, ident, folder = locate(cfg.data)
    refuse_foreign(folder)
    manifest = read_whole(folder, ident)
    if manifest is not None:
        _for_run(cfg, recorded)(manifest)
