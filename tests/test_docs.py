"""The README and docs/: short README that starts with the two commands, links that resolve,
every page in the site's nav, every serve flag documented. (`make docs` builds the site with
mkdocs --strict, which also checks links and anchors inside docs/.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gnnserve.cli import SERVE_FLAGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """mkdocs' anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.MULTILINE)}


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file, or heading anchor in a .md file, does not exist."""
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, or an anchor on the same page (mkdocs checks those)
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve()
        missing_anchor = anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or missing_anchor:
            bad.append(target)
    return bad


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    assert lines[0] == "# gnnserve"
    head = "\n".join(lines[:10])
    assert "make demo" in head and "make test" in head


def test_every_relative_link_resolves() -> None:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    bad = {str(p.relative_to(ROOT)): broken_links(p) for p in pages}
    assert not {k: v for k, v in bad.items() if v}


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n## Part one\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#part-one) [gone](c.md) [no anchor](a.md#part-two) [web](https://x)")
    assert broken_links(page) == ["c.md", "a.md#part-two"]


def _nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(_nav_pages(i) for i in items)) if items else set()  # type: ignore[union-attr]


def test_every_docs_page_is_in_the_site_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == _nav_pages(config["nav"])


def test_every_serve_flag_is_in_the_configuration_page() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [flag for flag, dotted in SERVE_FLAGS if f"`{flag}` | `{dotted}`" not in text]
    assert not missing
