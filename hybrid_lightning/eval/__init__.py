"""Long-context evaluation: probe generators (tasks), teacher-forced scoring with incremental
states (scoring), one evaluation summed across ranks (runner), reports and their files (report),
the training callback (callback) and the offline command (command)."""
