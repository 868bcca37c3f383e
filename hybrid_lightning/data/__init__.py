"""Data: tokenizers, corpora, synthetic retrieval sequences and the LightningDataModule."""
