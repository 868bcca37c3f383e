"""What each config key means for a run, read from the tags of the schema (``role(...)`` in
``schema.py``; an untagged field is ``identity``; a tagged section tags every key under it):

    identity     what is trained: tells architectures apart in analysis; a resume refuses a change
    resumable    tells runs apart, yet a resume may change it (``train.max_steps``: a run trained further)
    bookkeeping  how a run is carried out, logged, stored or evaluated: neither
    label        names a run of an architecture (``seed``, ``name``): fixed for a run directory, not
                 part of the architecture

``RESUMABLE_CHANGES`` (``training/resume.py``'s resume check) and ``NOT_IDENTITY`` (analysis's
architectures) follow from these tags, and the docs' table is ``roles_table()``.
"""

from __future__ import annotations

from pydantic import BaseModel

from hybrid_lightning.config.fields import BOOKKEEPING, IDENTITY, LABEL, RESUMABLE, ROLE_KEY
from hybrid_lightning.config.loading import _section_type
from hybrid_lightning.config.schema import RunConfig

ROLE_NOTES = {
    IDENTITY: "tells architectures apart; a resume refuses a change",
    RESUMABLE: "tells runs apart; a resume may change it",
    BOOKKEEPING: "neither: may change on resume, same architecture",
    LABEL: "fixed for a run directory; not part of the architecture",
}


def _tag(field) -> str | None:
    extra = field.json_schema_extra
    return extra.get(ROLE_KEY) if isinstance(extra, dict) else None


def _walk(model: type[BaseModel], prefix: str, inherited: str | None, keys: dict, sections: dict) -> None:
    for name, field in model.model_fields.items():
        key, tag = prefix + name, _tag(field) or inherited
        section = _section_type(field.annotation)
        if section is not None:
            if tag is not None:
                sections[key] = tag
            if section is not field.annotation:  # an optional section (null by default): one key, its keys its role
                keys[key] = tag or IDENTITY
            else:
                _walk(section, key + ".", tag, keys, sections)
        else:
            keys[key] = tag or IDENTITY


def _roles() -> tuple[dict[str, str], dict[str, str]]:
    keys: dict[str, str] = {}
    sections: dict[str, str] = {}
    _walk(RunConfig, "", None, keys, sections)
    return keys, sections


ROLES, SECTION_ROLES = _roles()  # flattened key -> role; tagged section -> role
PARTS = tuple(name for name, f in RunConfig.model_fields.items()  # the run config's sections: model, data, train, eval
              if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))
SET_BY_DATA = frozenset({"model.vocab_size"})  # model keys the data decides (null: the tokenizer's vocabulary)
RESUMABLE_CHANGES = frozenset(k for k, r in ROLES.items() if r in (RESUMABLE, BOOKKEEPING))
NOT_IDENTITY = frozenset(k for k, r in ROLES.items() if r in (BOOKKEEPING, LABEL))


def role_of(key: str) -> str:
    """The role of a flattened key; a key the schema does not know (a config of another version) is
    ``identity`` unless a tagged section holds it."""
    if key in ROLES:
        return ROLES[key]
    sections = [s for s in SECTION_ROLES if key.startswith(s + ".")]
    return SECTION_ROLES[max(sections, key=len)] if sections else IDENTITY


def part_of(key: str) -> str:
    """The section of the run config (``PARTS``) a flattened key lies in: ``model`` for the model built,
    ``train`` for how it is trained, ...; "" for a key at the top (``seed``, ``name``)."""
    section = key.split(".")[0]
    return section if section in PARTS and "." in key else ""


def set_by_data(key: str) -> bool:
    """Whether ``key`` is decided by the data rather than chosen (``model.vocab_size``: the tokenizer's)."""
    return key in SET_BY_DATA


def may_change_on_resume(key: str) -> bool:
    return role_of(key) in (RESUMABLE, BOOKKEEPING)


def is_identity(key: str) -> bool:
    """Whether ``key`` tells architectures apart (analysis)."""
    return role_of(key) in (IDENTITY, RESUMABLE)


def roles_table() -> str:
    """The docs' Markdown table: each role, what it means, and its keys (a tagged section as ``eval.*``)."""
    lines = ["| role | meaning | keys |", "|---|---|---|"]
    for r, note in ROLE_NOTES.items():
        under = [f"`{s}.*`" for s, t in SECTION_ROLES.items() if t == r and not any(
            s.startswith(o + ".") for o in SECTION_ROLES)]
        keys = [f"`{k}`" for k, t in ROLES.items() if t == r and not any(k.startswith(s + ".") for s in SECTION_ROLES)]
        lines.append(f"| {r} | {note} | {', '.join(under + keys) if r != IDENTITY else 'every other key'} |")
    return "\n".join(lines)
