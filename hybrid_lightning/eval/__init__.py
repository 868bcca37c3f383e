"""Long-context evaluation: probe generators (tasks), teacher-forced scoring with incremental
states (scoring), one evaluation summed across ranks (runner), reports and their files (report),
and the training callbacks (callback); the offline commands on a checkpoint are in
``hybrid_lightning/offline.py``."""
