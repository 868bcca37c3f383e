"""What runs a grid's cells: one ``Executor`` class per way of running them, registered by name.

``grid submit --executor NAME`` builds ``EXECUTORS[NAME]`` with the command's options; every job
record in ``<root>/.grid/jobs.json`` carries the name of the executor that wrote it, and ``grid
status`` and ``grid cancel`` ask that executor about the record. The built-in executors are
``slurm`` (``grid/slurm.py``) and ``local`` (``grid/local.py``); they register when the
``hybrid_lightning.grid`` package is imported.

Adding an executor: a subclass with a ``name`` and a ``help`` line, decorated with ``@register``
and imported by ``grid/__init__.py``. The command line's ``--executor`` choices follow. An executor that
takes a profile (``takes_profile``) gets ``--profile`` and the ``--set`` items outside the run config
(``split_set``); what it knows of its scheduler stays in its module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hybrid_lightning.config import RunConfig

if TYPE_CHECKING:
    from hybrid_lightning.grid.spec import Cell, Grid


class Executor(ABC):
    """One way of running a grid's cells, and of reading back the jobs it recorded.

    An executor built without options still reads its records (``grid status``, ``grid cancel``).
    A job record is a plain dict in ``jobs.json``; the executor-neutral fields are ``executor``
    (its ``name``), ``log``, ``submitted`` and ``cancelled`` (set by ``grid cancel``); the others
    are the executor's own.

    Args:
        profile: the ``--profile`` file, for executors that take one.
        parallel: ``--parallel``, cells run at once by executors that run them here.
        overrides: ``--set PARAM=VALUE`` items, parameters of the profile set on the command line.
    """

    name: ClassVar[str]  # --executor NAME, and the "executor" field of its job records
    help: ClassVar[str]  # one line for --executor's help
    takes_profile: ClassVar[bool] = False  # --profile and --set PARAM=VALUE (a key outside the run config) set it up

    def __init__(self, profile: str | Path | None = None, parallel: int = 1, overrides: Sequence[str] = ()):
        self.profile, self.parallel, self.overrides = profile, parallel, tuple(overrides)

    @abstractmethod
    def check(self) -> None:
        """Before anything is submitted: a ``ValueError`` naming a bad option, a bad profile, or
        what is unavailable here (e.g. the cluster)."""

    def check_cells(self, cells: list[Cell]) -> str | None:
        """After ``check()``, before anything is submitted: a ``ValueError`` naming a cell that this
        executor cannot run (e.g. a world its machines cannot hold); a note on what could not be
        checked, or None. Default: every cell can run."""
        return None

    def check_plan(self, cells: list[Cell]) -> str | None:
        """``grid plan``'s check of where the cells would run, before anything exists to submit: a ``ValueError``
        naming a cell that cannot run, a note on what could not be checked, or None. Default: ``check_cells``."""
        return self.check_cells(cells)

    @classmethod
    def split_set(cls, items: Sequence[str]) -> tuple[list[str], list[str]]:
        """``--set`` items: (those of the cells' configs, e.g. ``train.max_steps=20``; this executor's parameters,
        e.g. ``timeout_min=60``), told apart by the key's first part; a ``ValueError`` for a parameter of an
        executor that takes none."""
        cell = [item for item in items if is_config_item(item)]
        own = [item for item in items if item not in cell]
        if own and not cls.takes_profile:
            raise ValueError(f"--set {own[0]}: not a key of the run config ({', '.join(CELL_KEYS)}), and executor "
                             f"{cls.name} takes no parameters")
        return cell, own

    @abstractmethod
    def submit(self, grid: Grid, cells: list[Cell], say: Callable[[str], None]) -> None:
        """Hands ``cells`` over and appends one job record per cell (``state.add_records``).
        Called under ``state.lock(grid)`` after ``check()``."""

    def run(self, grid: Grid, cells: list[Cell], say: Callable[[str], None]) -> int:
        """After the lock is released: runs the submitted ``cells`` in this process, for executors
        that do, and returns the command's exit code. By default the jobs run elsewhere: 0."""
        return 0

    @abstractmethod
    def cancel(self, records: list[dict]) -> None:
        """Stops the live jobs of ``records`` (called under the lock; the caller marks them cancelled)."""

    @abstractmethod
    def live_states(self, records: list[dict]) -> list[str | None]:
        """For each record (the newest of its cell), the state of its job while it is alive:
        ``pending``, ``running``, ``requeued`` or another live state of the executor's own;
        None when the job is gone. A cancelled job stays live until it is gone."""

    @abstractmethod
    def job_id(self, record: dict) -> str | None:
        """The job's id as ``grid status`` shows it; None before it has one."""

    def abandoned(self, record: dict) -> bool:
        """Whether the record's job never started and never will (e.g. queued by a local submit
        that ended first): the cell then counts as having no job. Default: False."""
        return False

    def ending(self, record: dict) -> tuple[str, str] | None:
        """(time, cause) when something outside the run ended the job: cause '' for a
        cancellation, else why (e.g. 'TIME LIMIT'). Default: None (not known)."""
        return None

    def failure(self, record: dict) -> str | None:
        """Why a job that ended early failed, as the executor knows it (e.g. an exit code);
        None sends the reader to the log. Default: None."""
        return None

    def lost_task(self, record: dict) -> str | None:
        """In a job of several tasks, the task that ended badly before the others, with its rank and
        node (e.g. ``rank 1 on n2: Killed``): the cause when the others then fail. Default: None."""
        return None


EXECUTORS: dict[str, type[Executor]] = {}
CELL_KEYS = tuple(k for k in RunConfig.model_fields if k != "name")  # --set keys under these set every cell's config


def is_config_item(item: str) -> bool:
    """Whether a ``--set KEY=VALUE`` item sets the cells' config (its key's first part a section of it)."""
    return item.partition("=")[0].strip().split(".")[0] in CELL_KEYS


def register(cls: type[Executor]) -> type[Executor]:
    """Adds ``cls`` to ``EXECUTORS`` under ``cls.name`` (usable as a class decorator)."""
    assert cls.name not in EXECUTORS, f"executor {cls.name!r} registered twice"
    EXECUTORS[cls.name] = cls
    return cls


def executor_for(name: str | None, profile: str | Path | None = None, items: Sequence[str] = ()) -> type[Executor]:
    """The executor ``--executor NAME`` names; without one (``grid plan``, a preview), the first registered that takes
    a profile where a profile or a ``--set`` item outside the run config is given, else the first that takes none."""
    if name is not None:
        return executor_class(name)
    wanted = profile is not None or not all(is_config_item(item) for item in items)
    return next(cls for cls in EXECUTORS.values() if cls.takes_profile == wanted)


def executor_class(name: str) -> type[Executor]:
    """The executor registered as ``name``; a ``ValueError`` listing the names otherwise."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; executors: {list(EXECUTORS)}")
    return EXECUTORS[name]
