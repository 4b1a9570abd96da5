"""The repository refers its users only to what they have: no files outside it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tooling import REPO, tracked_files

# Files of the team's workspace, next to the repository but never part of it (CI's own
# scripts under .ci/ may use the workspace's tools; users never see them).
OUTSIDE = re.compile(r"DESIGN\.md|shared/recordings")


def test_no_file_refers_to_files_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if path.suffix in (".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".cfg", "") \
                and path.is_file() and path != Path(__file__) \
                and path.relative_to(REPO).parts[0] != ".ci":
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


def test_the_readme_documents_make_clean_and_make_lock_which_exist() -> None:
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    for target in ("clean", "lock"):
        assert f"`make {target}`" in readme
        assert re.search(rf"^{target}:", makefile, re.M)
    assert "regenerate: make lock" in (REPO / "requirements.txt").read_text()
