"""The wheel (what the image installs) holds every package of the tree: a subpackage left out
of pyproject.toml imports in the editable checkout and fails only in the container."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_in_the_tree_is_in_the_wheel() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for top, where in tool["package-dir"].items():
        base = ROOT / where
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join((top, *rel.parts)))
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == set(), "pyproject.toml lists packages that do not exist"
