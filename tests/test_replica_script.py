"""ablations/cpu_replica.sh's orchestration, with a stand-in for the command line (``HYBRID_LIGHTNING``): a run is
ablated, diagnosed and packed as soon as it is done, while the grid still trains; one whose diagnostics fail is
packed as it is at the end; stopped, the script stops its grid and keeps what finished."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import REPO

# The stand-in: logs each call; `grid submit` makes cell A done, waits (up to 20 s) for A's packed record, says
# whether it came while the grid trained, then makes cell B done (or, with STOP_AFTER_A, waits for SIGTERM).
FAKE_HL = r"""#!/usr/bin/env bash
echo "$*" >> "$LOG"
done_cell() {
    mkdir -p "runs/g/$1/checkpoints"
    touch "runs/g/$1/config.yaml" "runs/g/$1/checkpoints/last.ckpt"
    echo '{"state": "done"}' > "runs/g/$1/status.json"
}
case "$1" in
grid)
    trap 'echo "grid stopped" >> "$LOG"; exit 143' TERM
    done_cell A
    for _ in $(seq 200); do [ -e analysis/results/g/runs/A/packed ] && break; sleep 0.1; done
    [ -e analysis/results/g/runs/A/packed ] && echo "A packed while training" >> "$LOG"
    if [ -n "${STOP_AFTER_A:-}" ]; then
        for _ in $(seq 600); do sleep 0.1; done
        exit 0
    fi
    done_cell B
    echo "grid end" >> "$LOG" ;;
pack)
    mkdir -p "$4" && echo "$2" >> "$4/packed" ;;
gradient)
    case "$2" in *B) exit 1 ;; esac ;;
esac
exit 0
"""


def replica(tmp_path: Path, **env: str) -> tuple[Path, subprocess.Popen]:
    """A copy of the script in a repository of its own (its training data already written), started."""
    (tmp_path / "ablations").mkdir()
    shutil.copy(REPO / "ablations" / "cpu_replica.sh", tmp_path / "ablations")
    (tmp_path / "ablations" / "g.yaml").write_text("")
    data = tmp_path / "runs" / "cpu_replica"
    data.mkdir(parents=True)
    for name in ("probes", "trace_niah", "text_val"):
        (data / f"{name}.jsonl").write_text("")
    fake = tmp_path / "hl"
    fake.write_text(FAKE_HL)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    proc = subprocess.Popen(["bash", "ablations/cpu_replica.sh", "ablations/g.yaml"], cwd=tmp_path,
                            env={**os.environ, "HYBRID_LIGHTNING": str(fake), "LOG": str(log), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return log, proc


def calls(log: Path, command: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith(command)]


def test_a_run_is_finished_as_soon_as_it_is_done_and_one_that_fails_is_packed_at_the_end(tmp_path):
    log, proc = replica(tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # B's diagnostics failed
    lines = log.read_text().splitlines()
    assert "A packed while training" in lines, (lines, out)
    assert lines.index("A packed while training") < lines.index("grid end")
    assert [c.split()[1] for c in calls(log, "heads")] == ["runs/g/A", "runs/g/B"]  # each once
    assert [c.split()[1] for c in calls(log, "trace")] == ["runs/g/A"]  # B stopped at its failed gradient
    assert (tmp_path / "runs/g/A/packed.log").exists() and not (tmp_path / "runs/g/B/packed.log").exists()
    assert "runs/g/B: not finished" in out
    assert calls(log, "pack runs/g ") == ["pack runs/g --out analysis/results/g/runs"]  # B as it is, with the rest
    assert calls(log, "analyze") == ["analyze analysis/results/g/runs --grid ablations/g.yaml --findings "
                                     "--out analysis/results/g"]


def test_the_script_stopped_stops_its_grid_and_keeps_what_finished(tmp_path):
    log, proc = replica(tmp_path, STOP_AFTER_A="1")
    deadline = time.monotonic() + 60
    while "A packed while training" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out  # the grid's status: stopped
    lines = log.read_text().splitlines()
    assert "grid stopped" in lines and "grid end" not in lines
    assert (tmp_path / "analysis/results/g/runs/A/packed").exists()
    assert len(calls(log, "analyze")) == 1
