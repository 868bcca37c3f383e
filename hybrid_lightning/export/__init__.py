"""Export to the ``transformers`` format: ``hybrid-lightning export RUN_DIR --out DIR`` (folder.py) writes
the weights, the configuration, the model source (source.py, remote/) and the tokenizer (tokenizer.py);
``--probes`` adds probes as lm-evaluation-harness tasks (lm_eval_task.py)."""

from hybrid_lightning.export.folder import export_run

__all__ = ["export_run"]
