"""Every relative link of the README and the pages under docs/ leads to a file that exists, and to a heading of
it when it names one (GitHub's anchors: lower case, punctuation dropped, spaces as dashes); every page is
reached from the README."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings (code blocks skipped)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = set()
    for heading in re.findall(r"(?m)^#+ (.+)$", text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_every_page_is_reached_from_the_readme() -> None:
    """Following relative links from the README reaches every page under docs/."""
    seen, todo = set(), [(ROOT / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text):
            linked = (page.parent / target).resolve()
            if linked.suffix == ".md" and linked.exists() and not re.match(r"[a-z]+://", target):
                todo.append(linked)
    unreached = [p.name for p in PAGES[1:] if p.resolve() not in seen]
    assert not unreached, unreached
