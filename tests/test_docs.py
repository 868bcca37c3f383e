"""The documentation: the configuration reference is generated from the schema and current, and every
relative link of the README and docs/ points at a file of the tree."""

import re

from conftest import REPO
from hybrid_lightning.config import config_to_dict, flatten
from hybrid_lightning.config.docs import reference
from hybrid_lightning.config.roles import roles_table
from hybrid_lightning.config.schema import RunConfig


def test_the_configuration_reference_is_current():
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == reference(), (
        "docs/configuration.md is stale: python -m hybrid_lightning.config.docs > docs/configuration.md")


def test_the_configuration_reference_lists_every_key_with_a_description():
    text = reference()
    for key in flatten(config_to_dict(RunConfig())):
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        assert row.rstrip(" |").split(" | ")[-1].strip(), f"{key} has no description in the schema"


def test_the_resume_page_holds_the_current_roles_table():
    assert roles_table() in (REPO / "docs" / "resume.md").read_text(), (
        "paste config.roles.roles_table() into docs/resume.md")


def test_relative_links_point_at_files():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: {target}"
