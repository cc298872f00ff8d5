"""BENCHMARKS.md's links go somewhere: every `](#anchor)` names a heading of BENCHMARKS.md, and
every link into BENCHMARKS.md or BENCHMARKS-history.md (from either file) names a heading of
the file it points to, with GitHub's anchors (lower case, punctuation dropped, each space a
hyphen, `-1`, `-2` ... for repeated headings); a section of the docs named in prose
("docs/streaming.md, *Where the fold runs*") begins a heading of that page. Pure text, no
Markdown library."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("BENCHMARKS.md", "BENCHMARKS-history.md")
LINK = re.compile(r"\]\(([^)\s]*)#([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
DOC_SECTION = re.compile(r"(docs/[\w-]+\.md),\s+\*([^*]+)\*")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """A page's heading texts (fenced code skipped: `# comment` lines are no headings there)."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is not None:
            found.append(match.group(2))
    return found


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in headings(markdown):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(markdown: str) -> list[tuple[int, str, str]]:
    """(line, target file or "" for the same file, anchor) of each link with an anchor."""
    return [
        (number, match.group(1), match.group(2))
        for number, line in enumerate(markdown.splitlines(), start=1)
        for match in LINK.finditer(line)
    ]


def broken_links(root: Path = ROOT) -> list[str]:
    texts = {name: (root / name).read_text(encoding="utf-8") for name in FILES}
    heads = {name: anchors(text) for name, text in texts.items()}
    broken: list[str] = []
    for name, text in texts.items():
        for number, target, fragment in links(text):
            file = target or name
            if file not in heads:
                continue  # a link into docs/ or elsewhere: not this test's
            if fragment not in heads[file]:
                broken.append(f"{name}:{number}: no heading #{fragment} in {file}")
    return broken


def missing_doc_sections(root: Path = ROOT) -> list[str]:
    """Sections of docs/*.md named in prose that begin no heading of that page."""
    missing: list[str] = []
    for name in FILES:
        text = " ".join((root / name).read_text(encoding="utf-8").split())
        for match in DOC_SECTION.finditer(text):
            page = root / match.group(1)
            title = match.group(2).strip().lower()
            if not page.exists():
                missing.append(f"{name}: {match.group(1)} does not exist")
                continue
            titles = [h.lower() for h in headings(page.read_text(encoding="utf-8"))]
            if not any(h.startswith(title) for h in titles):
                missing.append(f"{name}: no heading *{match.group(2)}* in {match.group(1)}")
    return missing


def test_every_docs_section_the_benchmarks_name_exists() -> None:
    missing = missing_doc_sections()
    assert not missing, "\n".join(missing)


def test_every_anchor_link_in_the_benchmarks_resolves() -> None:
    broken = broken_links()
    assert not broken, "\n".join(broken)


def test_the_benchmarks_open_with_a_summary() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    first = re.search(r"^## (.+)$", text, re.MULTILINE)
    assert first is not None and first.group(1).startswith("Summary")


def test_anchors_follow_github() -> None:
    assert anchor("End to end: `dispatch bench`") == "end-to-end-dispatch-bench"
    assert anchor("The fold on executors against the driver's (`--fold-on`)") == (
        "the-fold-on-executors-against-the-drivers---fold-on"
    )
    assert anchor("Failover: kill → first assignment by the new leader") == (
        "failover-kill--first-assignment-by-the-new-leader"
    )
    assert anchors("# A\n```bash\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "BENCHMARKS.md").write_text(
        "# Top\n\nSee [x](#nowhere) and [y](BENCHMARKS-history.md#old).\n", encoding="utf-8"
    )
    (tmp_path / "BENCHMARKS-history.md").write_text(
        "# Old\n\n[back](BENCHMARKS.md#top)\n", encoding="utf-8"
    )
    assert broken_links(tmp_path) == ["BENCHMARKS.md:3: no heading #nowhere in BENCHMARKS.md"]
