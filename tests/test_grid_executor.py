"""The executor registry: a new executor is one registered class, and ``grid submit``, ``grid
status`` and ``grid cancel`` (in this process, through ``cli.main``) use it like the built-in ones."""

import json

import pytest

from hybrid_lightning.cli import main
from hybrid_lightning.grid import EXECUTORS, Executor, cell_states, load_grid, register
from hybrid_lightning.grid.state import add_records, now, read_jobs
from test_grid import write_grid


class QueueExecutor(Executor):
    """A cluster that is a dict: job id -> live state. A job removed from it has ended."""

    name = "queue"
    help = "an in-memory queue (tests)"
    queue: dict[str, str] = {}
    failures: dict[str, str] = {}  # job id -> why it failed
    submitted: list[str] = []
    cancelled: list[str] = []

    def check(self):
        if self.profile is not None:
            raise ValueError("--profile: the queue executor takes none")

    def submit(self, grid, cells, say):
        records = {}
        for cell in cells:
            job = f"q{len(self.submitted) + 1}"
            self.submitted.append(job)
            self.queue[job] = "pending"
            records[cell.name] = {"executor": self.name, "job_id": job, "log": f"/queue/{job}.log", "submitted": now()}
        add_records(grid, records)
        say(f"queued {len(cells)} cell(s)")

    def cancel(self, records):
        for record in records:
            del self.queue[record["job_id"]]
            self.cancelled.append(record["job_id"])

    def live_states(self, records):
        return [self.queue.get(r["job_id"]) for r in records]

    def job_id(self, record):
        return record["job_id"]

    def failure(self, record):
        return self.failures.get(record["job_id"])


@pytest.fixture
def queue_executor():
    register(QueueExecutor)
    QueueExecutor.queue, QueueExecutor.failures, QueueExecutor.submitted, QueueExecutor.cancelled = {}, {}, [], []
    yield QueueExecutor
    EXECUTORS.pop(QueueExecutor.name, None)


def cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def status(capsys, path):
    code, out, _ = cli(capsys, "grid", "status", str(path), "--json")
    assert code == 0
    return {row["name"]: row for row in json.loads(out)}


def test_a_registered_executor_submits_reports_and_cancels(tmp_path, capsys, queue_executor):
    path = write_grid(tmp_path, axes={"seed": [0, 1]})
    grid = load_grid(path)
    a, b = (c.name for c in grid.cells)

    code, _, err = cli(capsys, "grid", "submit", str(path), "--executor", "queue", "--profile", "p.yaml")
    assert code == 2 and err.strip() == "hybrid-lightning grid submit: error: --profile: the queue executor takes none"
    assert read_jobs(grid) == {}  # checked before anything is submitted

    code, out, _ = cli(capsys, "grid", "submit", str(path), "--executor", "queue")
    assert code == 0 and "2 to submit" in out and "queued 2 cell(s)" in out, out
    assert {n: r[-1]["executor"] for n, r in read_jobs(grid).items()} == {a: "queue", b: "queue"}
    rows = status(capsys, path)
    assert [(r["state"], r["job_id"], r["log"], r["live"]) for r in rows.values()] == [
        ("pending", "q1", "/queue/q1.log", True), ("pending", "q2", "/queue/q2.log", True)]

    queue_executor.queue["q1"] = "running"
    del queue_executor.queue["q2"]
    queue_executor.failures["q2"] = "node lost"
    rows = status(capsys, path)
    assert (rows[a]["state"], rows[b]["state"], rows[b]["reason"]) == ("running", "failed", "node lost")
    code, out, _ = cli(capsys, "grid", "status", str(path))
    assert f"failed {b}: node lost" in out

    code, out, _ = cli(capsys, "grid", "submit", str(path), "--executor", "queue")  # the live cell is skipped
    assert code == 0 and "1 to submit" in out and len(read_jobs(grid)[a]) == 1 and len(read_jobs(grid)[b]) == 2

    code, out, _ = cli(capsys, "grid", "cancel", str(path), a)
    assert code == 0 and f"{a} (running, job q1)" in out
    assert queue_executor.cancelled == ["q1"] and read_jobs(grid)[a][-1]["cancelled"]
    rows = status(capsys, path)
    assert (rows[a]["state"], rows[b]["state"], rows[b]["job_id"]) == ("cancelled", "pending", "q3")

    del EXECUTORS["queue"]  # records of an executor that is not registered
    with pytest.raises(ValueError, match="unknown executor 'queue'"):
        cell_states(grid)
    register(QueueExecutor)


def test_the_command_line_offers_the_registered_executors(tmp_path, capsys, queue_executor):
    assert main(["grid", "submit", str(tmp_path / "g.yaml"), "--executor", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--executor nope: one of" in err and all(f"'{name}'" in err for name in ("local", "slurm", "queue"))
    with pytest.raises(SystemExit):
        main(["grid", "submit", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # the registry is not imported for --help (tests/test_preview.py)
    assert "--executor NAME local, slurm or another registered executor (docs/grids.md)" in out
