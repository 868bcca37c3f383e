"""Each config key's role is tagged once in the schema (config/roles.py); the resume check and analysis's
architectures follow from the tags, so they cannot disagree."""

import pytest

from hybrid_lightning.analysis.load import _identity
from hybrid_lightning.config import RunConfig, config_to_dict, flatten
from hybrid_lightning.config.fields import BOOKKEEPING, IDENTITY, LABEL, RESUMABLE
from hybrid_lightning.config.roles import NOT_IDENTITY, RESUMABLE_CHANGES, ROLES, SECTION_ROLES, role_of, roles_table
from hybrid_lightning.kinds import KINDS, expand, layer_traits
from hybrid_lightning.runplan import Budget, LayerPlan, RunPlan
from hybrid_lightning.training.resume import check_same_config

CFG = RunConfig.model_validate({"model": {"pattern": "EEEF", "mixer": "swa", "vocab_size": 256}})

# The roles, written by hand: every key that is not identity (the default), and the sections tagged as a whole.
# A key tagged otherwise in the schema, or a new key tagged anything but identity, fails the test below until
# this table says so too.
WRITTEN_ROLES = {
    "name": LABEL, "seed": LABEL,
    "train.max_steps": RESUMABLE,
    **dict.fromkeys([
        "model.attn_backend", "model.recurrent_backend", "model.recurrent_chunk", "model.require_fast_kernels",
        "data.text_val_files", "data.cache_dir", "data.store", "data.shard_mb", "data.prepare_workers",
        "data.num_workers",
        "train.activation_checkpointing", "train.check_memory", "train.compile", "train.threads",
        "train.checkpoint_every_n_steps", "train.keep_checkpoints", "train.log_every_n_steps",
        "train.val_every_n_steps", "train.val_batches", "train.progress_bar", "train.stable_phase",
    ], BOOKKEEPING),
}
WRITTEN_SECTIONS = {"eval": BOOKKEEPING, "eval.heads": BOOKKEEPING, "eval.trace": BOOKKEEPING,
                    "train.stable_phase": BOOKKEEPING}
# Keys that decide what is trained; a few of them, named so that the table's default is not taken on trust.
WRITTEN_IDENTITY = ["train.accumulate_grad_batches", "train.batch_size", "train.seq_len", "train.lr", "data.doc_mask",
                    "model.pattern", "model.mixer", "model.window", "model.d_model", "model.pos.full"]


def written_role(key: str) -> str:
    """A key's role by the written table: its own entry, else its section's, else identity."""
    if key in WRITTEN_ROLES:
        return WRITTEN_ROLES[key]
    return next((WRITTEN_SECTIONS[s] for s in WRITTEN_SECTIONS if key.startswith(s + ".")), IDENTITY)


def test_each_keys_role_is_the_one_written_here():
    assert SECTION_ROLES == WRITTEN_SECTIONS
    assert {k: r for k, r in ROLES.items() if r != IDENTITY and not k.startswith("eval.")} == WRITTEN_ROLES
    assert {k: role_of(k) for k in ROLES} == {k: written_role(k) for k in ROLES}
    assert all(k in ROLES and role_of(k) == IDENTITY for k in WRITTEN_IDENTITY)


def _changed(key: str) -> dict:
    """The config as a nested dict with ``key`` set to a value it never has."""
    raw = config_to_dict(CFG)
    *sections, last = key.split(".")
    d = raw
    for s in sections:
        d = d[s]
    d[last] = "<changed>"
    return raw


@pytest.mark.parametrize("key", sorted(ROLES))
def test_a_resume_refuses_exactly_the_keys_that_are_fixed_for_a_run(key, tmp_path):
    if written_role(key) in (RESUMABLE, BOOKKEEPING):
        check_same_config(tmp_path, _changed(key), CFG, "config.yaml")
        assert key in RESUMABLE_CHANGES
    else:
        with pytest.raises(ValueError, match=f"{key}: '<changed>'"):
            check_same_config(tmp_path, _changed(key), CFG, "config.yaml")


def test_analysis_tells_architectures_apart_by_the_identity_keys():
    """With every layer kind present (E, F, a window), the architecture holds exactly the identity and
    resumable keys but the option sections of mixers the plan does not use; the bookkeeping and label keys
    are left out."""
    flat = flatten(config_to_dict(CFG))
    m = CFG.model
    layers = tuple(LayerPlan(i, mixer, *layer_traits(mixer, m.window, m.pos.full, m.pos.efficient))
                   for i, mixer in enumerate(expand(m.pattern, m.n_layers, m.mixer)))
    arch = _identity(flat, RunPlan(layers, Budget(128, 16, 1, 1, 200)))
    unused = tuple(f"model.{k.section}." for k in KINDS.values() if k.section and k.name not in m.mixers_used)
    assert set(arch) == {k for k in flat if written_role(k) in (IDENTITY, RESUMABLE) and not k.startswith(unused)}
    assert not set(arch) & NOT_IDENTITY
    # the keys where the old lists disagreed: the store's and the backends' now agree with the resume check
    for key in ("data.store", "data.shard_mb", "data.prepare_workers", "model.attn_backend", "train.val_batches"):
        assert key in RESUMABLE_CHANGES and key in NOT_IDENTITY
    assert role_of("train.max_steps") == RESUMABLE and role_of("seed") == role_of("name") == LABEL
    assert role_of("eval.some_future_key") == BOOKKEEPING and role_of("model.some_future_key") == IDENTITY


def test_the_roles_table_names_every_tagged_key():
    table = roles_table()
    assert "`eval.*`" in table and "`train.max_steps`" in table and "`seed`" in table
    for key in RESUMABLE_CHANGES | NOT_IDENTITY:
        if not key.startswith("eval."):
            assert f"`{key}`" in table, key


def test_tokens_per_step_is_the_plans_alone():
    """One formula (the run plan's ``Budget``): no other module multiplies batch size by sequence length."""
    import ast

    from conftest import REPO
    from hybrid_lightning.config import TrainConfig
    from hybrid_lightning.plan.resolve import budget

    b = budget(TrainConfig(batch_size=4, seq_len=8, devices=2, num_nodes=3, accumulate_grad_batches=2))
    assert b.world_size == 6 and b.tokens_per_step == 4 * 8 * 6 * 2 and b.tokens_at(3) == 3 * b.tokens_per_step
    assert budget(TrainConfig(accelerator="cpu")).world_size == 1  # devices: auto on the CPU
    found = []
    for path in sorted([*(REPO / "hybrid_lightning").rglob("*.py"), *(REPO / "analysis").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "value", None) for n in ast.walk(node)}
                if {"batch_size", "seq_len"} <= names and path.name != "runplan.py":
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found



def test_data_files_moved_elsewhere_are_the_same_run_and_renamed_ones_are_not(tmp_path):
    """A run directory unpacked or moved next to data at another path holds the same run; another file
    (by name) does not. What the files hold is checked by the data fingerprint when training resumes."""
    def with_files(*files):
        return RunConfig.model_validate({**config_to_dict(CFG), "data": {"files": files}})

    old = config_to_dict(with_files("/old/checkout/runs/a.jsonl", "/old/b.txt"))
    check_same_config(tmp_path, old, with_files("/new/place/a.jsonl", "/new/b.txt"), "config.yaml")
    with pytest.raises(ValueError, match="data.files"):
        check_same_config(tmp_path, old, with_files("/new/place/a.jsonl", "/new/c.txt"), "config.yaml")
