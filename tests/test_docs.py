"""The README is an entry document: short, self-consistent, linked only within the repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
PROCESS = re.compile(
    r"issue [0-9]|the issue|issue's|previous session|this session|the session's|coordinator", re.IGNORECASE
)


def _toml_blocks(text: str) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)


def test_the_readme_is_short_and_has_its_entry_sections() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for needed in ("## Install", "make demo", "make test", "## Your own model", "## Commands", "<!-- outcomes"):
        assert needed in text, needed


def test_the_readme_shows_the_bundled_study_file_as_it_is() -> None:
    shown = [tomllib.loads(block) for block in _toml_blocks(README.read_text())]
    bundled = tomllib.loads((REPO / "studies" / "efficientnet_lite0.toml").read_text())
    assert bundled in shown


def test_docs_speak_about_the_product_not_how_it_was_made() -> None:
    for path in [README, *DOCS]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not PROCESS.search(line), f"{path.name}:{number}: {line}"


def test_links_stay_inside_the_repository_and_resolve() -> None:
    for path in [README, *DOCS]:
        for target in LINK.findall(path.read_text()):
            assert not re.match(r"[a-z]+://", target), f"{path.name}: a link outside the repository: {target}"
            file = target.split("#", 1)[0]
            if file:
                assert (path.parent / file).exists(), f"{path.name}: {target} does not exist"
