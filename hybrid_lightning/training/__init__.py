"""Training: the LightningModule, the Trainer assembly and the run orchestration."""
