"""The generated blocks of README.md and docs/: every number a page quotes from a results
set or the accountant sits between markers and is rendered, never typed.

    <!-- KIND: ARGS -->
    ...what render(KIND, ARGS) returns...
    <!-- end KIND -->

Kinds: ``table1 <set>`` (a set's Table 1, ``resultset.readme_table``), ``timings <set>...``
and ``timings totals <set>...`` (``timings.timings_table``), ``epsilons <config> <exp>...``
(σ, steps and ε of experiments trained on N records, ``epsilons <config> N <exp>...``,
:func:`epsilon_table`). Paths are relative to the
repository root. ``tests/test_docs.py`` renders every block of every page and compares;
``python -m dpsinkhorn.report.docblocks PAGE...`` rewrites the pages' blocks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dpsinkhorn.report import timings

#: one block: (kind, its arguments, the body, the end marker's kind)
BLOCK = re.compile(r"<!-- ([a-z0-9 ]+?): ([^>]*?) -->\n(.*?)<!-- end (\w+) -->", re.S)
KINDS = ("table1", "timings", "timings totals", "epsilons")


def epsilon_table(config_path: Path, records: int, names: list[str]) -> str:
    """Per experiment: its σ and steps, sound ε by RDP and by PLD, and the paper's
    convention (``compute_rdp(q, σ, steps·B)``), q = B / ``records`` (the training size)."""
    from dpsinkhorn.config import experiment, load_config
    from dpsinkhorn.privacy.accounting import compute_epsilon, paper_convention_epsilon
    from dpsinkhorn.report.common import DATASET_TITLES

    config = load_config([config_path])
    lines = [
        "| setting | sound ε (RDP) | sound ε (PLD) | paper convention |",
        "| --- | --- | --- | --- |",
    ]
    for name in names:
        spec = experiment(config, name)
        sigma, steps, delta = spec["sigma"], spec["steps"], spec["delta"]
        q = spec["batch_size"] / records
        rdp = compute_epsilon(sigma, q, steps, delta)
        pld = compute_epsilon(sigma, q, steps, delta, accountant="pld")
        paper = paper_convention_epsilon(q, sigma, steps, spec["batch_size"], delta)
        title = DATASET_TITLES.get(spec["dataset"], spec["dataset"])
        lines.append(
            f"| {title}, σ = {sigma:g}, {steps:,} steps | {rdp:.3f} | {pld:.3f} | {paper:.2f} |"
        )
    return "\n".join(lines) + "\n"


def render(kind: str, args: str, root: Path) -> str:
    """The body of one block; a one-line error names an unknown kind."""
    paths = [root / a for a in args.split()]
    if kind == "table1":
        from dpsinkhorn.report.resultset import readme_table

        return readme_table(paths[0])
    if kind in ("timings", "timings totals"):
        return timings.timings_table(paths, totals=kind == "timings totals")
    if kind == "epsilons":
        return epsilon_table(paths[0], int(args.split()[1]), args.split()[2:])
    raise ValueError(f"unknown generated block {kind!r}; known: {', '.join(KINDS)}")


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(kind, arguments, body) of each block of ``text``."""
    found = []
    for kind, args, body, end in BLOCK.findall(text):
        if kind.split()[0] != end:
            raise ValueError(f"<!-- {kind}: {args} --> ends with <!-- end {end} -->")
        found.append((kind, args, body))
    return found


def render_page(text: str, root: Path) -> str:
    """``text`` with every block's body rendered again."""
    return BLOCK.sub(
        lambda m: (
            f"<!-- {m.group(1)}: {m.group(2)} -->\n"
            + render(m.group(1), m.group(2), root)
            + f"<!-- end {m.group(4)} -->"
        ),
        text,
    )


def main(pages: list[str]) -> None:
    """Rewrite the blocks of each page (run from the repository root)."""
    for page in map(Path, pages):
        page.write_text(render_page(page.read_text(), Path(".")))


if __name__ == "__main__":
    main(sys.argv[1:])
