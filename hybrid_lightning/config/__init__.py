"""Typed, frozen run configuration: one YAML file per run, validated once.

``schema.py`` holds the sections (each checks its own constraints); ``loading.py`` reads YAML,
applies ``--set dotted.key=value`` overrides and validates. The grid file's schema is in
``grid/schema.py``.
"""

from hybrid_lightning.config.loading import (
    apply_assignments,
    apply_overrides,
    config_to_dict,
    dump_config,
    flatten,
    load_config,
    parse_override,
    read_text_file,
    read_yaml,
    refuse_no_files,
    resolve_paths,
    suggest,
    validate,
    validate_config,
)
from hybrid_lightning.config.schema import (
    PROVENANCE_KEY,
    DataConfig,
    EvalConfig,
    HeadsConfig,
    ModelConfig,
    PosConfig,
    RunConfig,
    SyntheticConfig,
    TrainConfig,
)

__all__ = [
    "PROVENANCE_KEY",
    "DataConfig",
    "EvalConfig",
    "HeadsConfig",
    "ModelConfig",
    "PosConfig",
    "RunConfig",
    "SyntheticConfig",
    "TrainConfig",
    "apply_assignments",
    "apply_overrides",
    "config_to_dict",
    "dump_config",
    "flatten",
    "load_config",
    "parse_override",
    "read_text_file",
    "refuse_no_files",
    "read_yaml",
    "resolve_paths",
    "suggest",
    "validate",
    "validate_config",
]
