import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One tokenized-corpus cache for the whole session (built once, ~10 s)."""
    cache = os.environ.get("HYBRID_LIGHTNING_CACHE") or str(tmp_path_factory.mktemp("hl-cache"))
    os.environ["HYBRID_LIGHTNING_CACHE"] = cache
    return Path(cache)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m hybrid_lightning ARGS`` as a new user would, capturing output."""
    return subprocess.run(
        [sys.executable, "-m", "hybrid_lightning", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


TINY = [
    "--set", "model.n_layers=2", "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.window=32",
    "--set", "model.pattern=EF", "--set", "train.batch_size=8", "--set", "train.seq_len=128",
    "--set", "train.progress_bar=false", "--set", "data.max_tokens=2000000",
]


def _gloo_worker(rank: int, fn, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    out[rank] = fn(rank, world)
    torch.distributed.destroy_process_group()


def on_ranks(fn, world: int = 2, port: int = 29500) -> dict:
    """Runs ``fn(rank, world)`` (a module-level function) in ``world`` gloo processes; {rank: its result}."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gloo_worker, args=(fn, world, port + os.getpid() % 1000, out), nprocs=world)
        return dict(out)


def system_of(raw: dict):
    """The training system of the run config ``raw`` (plain data), planned as ``train`` plans it."""
    from hybrid_lightning.config import config_to_dict, validate_config
    from hybrid_lightning.plan.resolve import plan_run
    from hybrid_lightning.training.system import LMSystem

    cfg, plan = plan_run(validate_config(raw))
    return LMSystem(config_to_dict(cfg), plan.as_dict())
