"""The generated blocks of README.md and docs/: every number a page quotes from a results
set or the accountant sits between markers and is rendered, never typed: a block
``<!-- KIND: ARGS -->`` ... ``<!-- end KIND -->`` (:data:`KINDS`, :func:`render`) or a number
in a sentence ``<!-- n: QUANTITY ARGS -->`` ... ``<!-- /n -->`` (:data:`QUANTITIES`,
:func:`value`); paths from the repository root. ``python -m dpsinkhorn.report.docblocks
PAGE...`` rewrites the pages' blocks; ``tests/test_docs.py`` compares."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from dpsinkhorn.report import timings

#: one block: (kind, its arguments, the body, the end marker's kind)
BLOCK = re.compile(r"<!-- ([a-z0-9 ]+?): ([^>]*?) -->\n(.*?)<!-- end (\w+) -->", re.S)
#: ``table1 SET`` (``resultset.readme_table``), ``timings SET...`` / ``timings totals SET...``
#: (``timings.timings_table``), ``epsilons CONFIG N EXP...`` (:func:`epsilon_table`)
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


#: one number inside a sentence: ``<!-- n: QUANTITY ARGS... -->text<!-- /n -->``
INLINE = re.compile(r"<!-- n: ([^>]*?) -->(.*?)<!-- /n -->")
QUANTITIES = (
    "generators CONFIG",
    "sigma CONFIG EXP DIGITS",
    "steps CONFIG EXP",
    "setting CONFIG EXP KEY",
    "epsilon CONFIG EXP DIGITS [rdp|pld|paper]",
    "cells CONFIG STUDY",
    "new-generators CONFIG STUDY",
    "privacy Q DELTA B STEPS EPSILON ACCOUNTANT DIGITS",
    "score SET EXP fid|logreg|mlp|cnn [mean|std]",
    "json FILE KEY.PATH FORMAT",
)


def _short_exponent(text: str) -> str:
    """``4.3e-04`` -> ``4.3e-4``, as the docs print exponents."""
    return re.sub(r"e([+-])0(\d)", r"e\1\2", text)


def value(args: str, root: Path) -> str:
    """One quoted number (:data:`QUANTITIES`), computed by the function that produces it:
    the config's σ, steps and ε (``privacy.budget``, ``privacy.accounting``; q = B / N of
    the dataset's training split; DP-MERF: one release, q = 1), a study's cells, a results
    set's score, a JSON field."""
    from dpsinkhorn.config import experiment, load_config, trained_experiments
    from dpsinkhorn.config.studies import study_cells, study_experiments
    from dpsinkhorn.config.validate import read_yaml
    from dpsinkhorn.data.catalog import TRAIN_SIZES
    from dpsinkhorn.privacy.accounting import compute_epsilon, paper_convention_epsilon
    from dpsinkhorn.privacy.budget import budget_of, privacy_report

    what, *rest = args.split()
    if what == "privacy":
        q, delta, batch, steps, eps, accountant, digits = rest
        numbers = {"q": float(q), "delta": float(delta), "epsilon": float(eps), "steps": int(steps)}
        report = privacy_report(**numbers, batch_size=int(batch), accountant=accountant)
        return f"{report['sigma']:.{digits}f}"
    if what == "score":
        from dpsinkhorn.config.targets import score_name
        from dpsinkhorn.report.common import accuracy_percent, read_number

        folder, name = root / rest[0] / rest[1], "fid" if rest[2] == "fid" else f"acc_{rest[2]}"
        read = (lambda path: read_number(path, "fid")) if name == "fid" else accuracy_percent
        if len(rest) == 3:  # seed 0
            return f"{read(folder / score_name(name, 0)):.1f}"
        values = [read(path) for path in sorted(folder.glob(f"{name}_seed*.json"))]
        stat = {"mean": statistics.mean, "std": statistics.stdev}[rest[3]](values)
        return f"{stat:.1f}"
    if what == "json":
        import json

        data = json.loads((root / rest[0]).read_text())
        for key in rest[1].split("."):
            data = data[key]
        return _short_exponent(format(data, rest[2]))
    config = load_config([root / rest[0]])
    if what == "generators":
        return str(len(trained_experiments(config)))
    if what == "cells":
        return str(len(study_cells(config, rest[1])))
    if what == "new-generators":
        declared = read_yaml(root / rest[0])["experiments"]
        return str(len(set(study_experiments(config, rest[1])) - set(declared)))
    spec = experiment(config, rest[1])
    num_records = TRAIN_SIZES[spec["dataset"]]
    if spec["method"] == "dpmerf":  # one Gaussian release of a sum over all records
        from dpsinkhorn.privacy.merf import merf_noise_multiplier

        sigma, steps, q = merf_noise_multiplier(spec), 1, 1.0
    else:
        sigma, steps = budget_of(spec, num_records)
        q = spec["batch_size"] / num_records
    if what == "sigma":
        return f"{sigma:.{rest[2]}f}"
    if what == "steps":
        return f"{steps:,}"
    if what == "setting":
        setting = spec[rest[2]]
        return f"{setting:,}" if isinstance(setting, int) else _short_exponent(f"{setting:g}")
    if what == "epsilon":
        accountant = rest[3] if len(rest) > 3 else "rdp"
        if accountant == "paper":
            eps = paper_convention_epsilon(q, sigma, steps, spec["batch_size"], spec["delta"])
        else:
            eps = compute_epsilon(sigma, q, steps, spec["delta"], accountant)
        return f"{eps:.{rest[2]}f}"
    raise ValueError(f"unknown quoted number {what!r}; known: {'; '.join(QUANTITIES)}")


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
    """``text`` with every block's body and every quoted number rendered again."""
    text = INLINE.sub(
        lambda m: f"<!-- n: {m.group(1)} -->{value(m.group(1), root)}<!-- /n -->", text
    )
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
