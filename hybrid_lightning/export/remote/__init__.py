"""The files an exported folder's ``transformers`` loader imports (``trust_remote_code=True``), copied
as they are by ``export/source.py``. ``modeling_hybrid_lightning`` imports the model files that exist
only in an exported folder, so it is not importable from here."""
