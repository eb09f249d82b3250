"""Every document the project cites is in the repository: a `docs/<name>.md` named anywhere in the
code, tests or docs, and every relative Markdown link in the docs and the README, resolves to a file."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/-]+\.md\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
TEXT = (".py", ".md", ".toml", ".yaml", ".yml", ".sh", "Makefile")


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [REPO / name for name in listed if name.endswith(TEXT) and (REPO / name).is_file()]


def test_every_docs_path_named_in_the_repository_exists() -> None:
    missing = {
        f"{path.relative_to(REPO)}: {cited}"
        for path in _tracked()
        for cited in DOCS_PATH.findall(path.read_text(errors="replace"))
        if not (REPO / cited).is_file()
    }
    assert not missing, sorted(missing)


def test_every_relative_markdown_link_in_the_docs_resolves() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing = {
        f"{page.relative_to(REPO)}: {link}"
        for page in pages
        for link in MARKDOWN_LINK.findall(page.read_text())
        if "://" not in link and not (page.parent / link).resolve().is_file()
    }
    assert not missing, sorted(missing)
