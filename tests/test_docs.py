"""README.md and docs/ against what they describe: Table 1 as the committed results sets
render it, the layout map against the package tree and the pages of docs/, and pages that
speak of the project rather than of their own writing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dpsinkhorn.report import timings
from dpsinkhorn.report.resultset import MISSING, committed_sets, readme_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PACKAGE = ROOT / "src" / "dpsinkhorn"
PAGES = sorted((ROOT / "docs").glob("*.md"))
#: README.md's length limit: a newcomer reads it in ten minutes
README_MAX_LINES = 250


def layout_block() -> str:
    """The code block of README.md's "## Layout" section."""
    section = README.split("\n## Layout\n", 1)[1]
    return re.search(r"```\n(.*?)```", section, re.S).group(1)


def layout_entries() -> dict[str, str]:
    """Each ``  name/`` entry of the package map with its continuation lines."""
    entries: dict[str, str] = {}
    current = None
    for line in layout_block().splitlines():
        head = re.match(r"^  (\w+)/\s", line)
        if head:
            current = head.group(1)
            entries[current] = line
        elif current and re.match(r"^ {6,}\S", line):
            entries[current] += " " + line
        else:
            current = None
    return entries


def test_readme_is_short():
    assert len(README.splitlines()) <= README_MAX_LINES


def sets_with_cells() -> list:
    """Committed sets that hold results of some experiment (a set may hold measurements
    only: step rates, a profile, a window's calls)."""
    return [
        s
        for s in committed_sets(ROOT)
        if json.loads((s / "provenance.json").read_text()).get("experiments")
    ]


@pytest.mark.parametrize("set_dir", sets_with_cells(), ids=lambda p: p.name)
def test_readme_table1_is_the_rendered_results_set(set_dir):
    """README's Table 1 block of each committed set with cells is exactly what the set's
    files render."""
    marker = f"<!-- table1: results-paper-scale/{set_dir.name} -->\n"
    assert marker in README, f"README.md has no Table 1 block {marker.strip()}"
    block = README.split(marker, 1)[1].split("<!-- end table1 -->", 1)[0]
    expected = readme_table(set_dir)
    assert block == expected, "README.md's Table 1 differs from the rendering:\n" + expected


def test_readme_table1_says_missing_where_nothing_was_measured():
    """Cells without a measured seed say so (the CPU-trained DP-MERF set has no evaluation)."""
    table = readme_table(ROOT / "results-paper-scale" / "dpmerf-cpu").splitlines()
    rows = [r for r in table if r.startswith("| ") and "(`mnist_" in r]
    assert rows and all(f"{MISSING} (0/5 seeds)" in r for r in rows)


def test_layout_names_every_module_of_the_package():
    """Every subpackage and module of src/dpsinkhorn appears in README's map, so a new
    module cannot go unmentioned."""
    entries = layout_entries()
    block = layout_block()
    unmentioned = []
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            words = set(re.findall(r"\w+", entries.get(path.name, "")))
            if path.name not in entries:
                unmentioned.append(f"{path.name}/")
            unmentioned += [
                f"{path.name}/{m.name}"
                for m in sorted(path.glob("*.py"))
                if m.stem != "__init__" and m.stem not in words
            ]
        elif path.suffix == ".py" and path.stem != "__init__":
            if not re.search(rf"(^|\s){re.escape(path.name)}\s", block, re.M):
                unmentioned.append(path.name)
    assert not unmentioned, f"README.md's Layout does not mention: {', '.join(unmentioned)}"


def test_layout_names_only_what_exists():
    missing = [name for name in layout_entries() if not (PACKAGE / name).is_dir()]
    missing += [
        name
        for name in re.findall(r"(?:^|\s)(\w+\.py)\s", layout_block(), re.M)
        if not (PACKAGE / name).is_file()
    ]
    assert not missing, f"README.md's Layout names what src/dpsinkhorn lacks: {missing}"


def test_readme_lists_every_page_of_docs():
    listed = set(re.findall(r"\]\(docs/(\w+\.md)\)", README))
    assert {p.name for p in PAGES} <= listed, sorted({p.name for p in PAGES} - listed)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_starts_with_what_it_is_for(page):
    """A title, then a paragraph (not a table, list or code) saying what the page is for."""
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == ""
    assert lines[2] and not lines[2].startswith(("|", "-", "*", "`", "#")), lines[2]


#: Phrases that tell the history of a document's own writing instead of the project.
HISTORY = re.compile(
    r"\bissue \d+|\bthis change\b|\bthis session\b|\bthis PR\b|\bthe CI of\b|\bat commit\b",
    re.I,
)
#: A commit hash: 7 to 12 hex digits with both a digit and a letter.
COMMIT = re.compile(r"(?<![-\w./])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b(?!…)")
#: A block rendered from a results set's files (a ledger's own text may name a commit).
GENERATED = re.compile(r"<!-- (table1|timings)[^>]*-->\n.*?<!-- end \w+ -->", re.S)
ALL_PAGES = [
    ROOT / "README.md",
    *PAGES,
    ROOT / "benchmarks" / "README.md",
    ROOT / "profiles" / "README.md",
]


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_tell_no_history_of_their_writing(page):
    text = GENERATED.sub("", page.read_text())
    found = [m.group(0) for m in HISTORY.finditer(text)] + COMMIT.findall(text)
    assert not found, f"{page.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_timings_blocks_are_the_rendered_sets(page):
    """Each page quotes times only as one block rendered from committed results sets."""
    text = page.read_text()
    blocks = timings.BLOCK.findall(text)
    assert len(blocks) <= 1, f"{page.relative_to(ROOT)}: {len(blocks)} timings tables, one at most"
    expected = timings.render_blocks(text, ROOT)
    assert text == expected, f"{page.relative_to(ROOT)}: a timings block differs:\n" + "".join(
        timings.timings_table([ROOT / s for s in b[1].split()], bool(b[0])) for b in blocks
    )


def test_readme_quotes_the_times_of_its_two_commands():
    (totals, sets, _), *_ = timings.BLOCK.findall(README)
    assert totals and "results-paper-scale/quick-cpu" in sets.split()
    block = timings.timings_table([ROOT / s for s in sets.split()], True)
    assert "| `make run` " in block and "| `make test` " in block
