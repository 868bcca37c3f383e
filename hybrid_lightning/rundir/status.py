"""A run's ``status.json`` and the process behind it: what state the run is in, and whether the process that
says it is running still lives."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from hybrid_lightning.fileio import owner_identity, pid_alive, process_start, write_atomic
from hybrid_lightning.rundir import STATUS_FILE


def read_status(run_dir: Path) -> dict | None:
    """``status.json``, None without one. A file that does not read as a status (written whole or not at all, so
    damaged) reads ``{"state": "damaged", "error": ...}`` naming it; a ``running`` status whose process is gone
    (on this host) reads ``interrupted``: that process was killed without a chance to write."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
        if not isinstance(status, dict) or not isinstance(status.get("state"), str):
            raise ValueError("not a JSON object with a state")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        error = f"{path} does not read as a run status ({e}); training the run rewrites it"
        return {"state": "damaged", "error": error}
    pid, host = int(status.get("pid") or 0), status.get("host")
    if status.get("state") == "running" and host == socket.gethostname() and not pid_alive(pid, status.get("started")):
        status.update(state="interrupted", error=f"killed: its process (pid {pid} on {host}) ended without a word")
    return status


def process_status(state: str, step: int | None, max_steps: int, **extra) -> dict:
    """The fields of ``status.json`` for this process at ``step`` (None: every checkpoint damaged)."""
    return {"state": state, "step": step, "max_steps": max_steps, "host": socket.gethostname(), "pid": os.getpid(),
            "started": process_start(os.getpid()), **owner_identity(), **extra}


def write_status(run_dir: Path, **fields) -> None:
    write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(fields, indent=1))
