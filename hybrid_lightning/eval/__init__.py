"""Long-context evaluation: teacher-forced scoring with incremental states (scoring), LongPPL key
tokens (longppl), one evaluation summed across ranks (runner), reports and their files (report), the
training callbacks (callback) and the offline commands on a checkpoint (offline). The probes come
from ``hybrid_lightning.probes``; retrieval heads and their ablation are ``hybrid_lightning.heads``."""
