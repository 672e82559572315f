"""README.md and docs/ against what they describe: Table 1 as the committed results sets
render it, the layout map against the package tree and the pages of docs/, and pages that
speak of the project rather than of their own writing."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from dpsinkhorn import fileio
from dpsinkhorn.config import experiment, load_config
from dpsinkhorn.privacy.accounting import compute_epsilon
from dpsinkhorn.privacy.budget import budget_of
from dpsinkhorn.privacy.merf import merf_noise_multiplier
from dpsinkhorn.report import docblocks, timings
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
    assert block == readme_table(set_dir), "README.md's Table 1 differs from the rendering"


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
#: A commit hash: 7 to 12 hex digits with both a digit and a letter (``repo@hash`` cites
#: another project's code and is allowed).
COMMIT = re.compile(r"(?<![-\w./@])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b(?!…)")
#: A block rendered from a results set's files (a ledger's own text may name a commit).
GENERATED = docblocks.BLOCK
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
def test_generated_blocks_are_rendered_from_their_sources(page):
    """Every number a page quotes from a results set or the accountant is a generated block
    (``report.docblocks``) equal to its rendering, and a page has one timings table at most."""
    text = page.read_text()
    found = docblocks.blocks(text)
    kinds = [kind.split()[0] for kind, _, _ in found]
    assert kinds.count("timings") <= 1, (
        f"{page.relative_to(ROOT)}: {kinds.count('timings')} timings tables"
    )
    for kind, args, body in found:
        expected = docblocks.render(kind, args, ROOT)
        assert body == expected, (
            f"{page.relative_to(ROOT)}: <!-- {kind}: {args} --> differs from its rendering "
            f"(python -m dpsinkhorn.report.docblocks {page.relative_to(ROOT)}):\n{expected}"
        )


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_numbers_are_rendered_from_their_sources(page):
    """Every number a sentence quotes (σ, steps, ε, cells, scores, measured errors) is an
    inline block ``<!-- n: ... -->`` equal to what ``report.docblocks.value`` computes."""
    for args, printed in docblocks.INLINE.findall(page.read_text()):
        expected = docblocks.value(args, ROOT)
        assert printed == expected, (
            f"{page.relative_to(ROOT)}: <!-- n: {args} --> prints {printed}, computed "
            f"{expected} (python -m dpsinkhorn.report.docblocks {page.relative_to(ROOT)})"
        )


def test_every_kind_of_quoted_number_is_used_and_a_wrong_one_is_caught():
    """Each quantity kind quotes at least one number somewhere in the docs, and rendering a
    page puts back a number edited by hand."""
    text = "\n".join(p.read_text() for p in ALL_PAGES)
    used = {args.split()[0] for args, _ in docblocks.INLINE.findall(text)}
    assert used == {q.split()[0] for q in docblocks.QUANTITIES}
    sentence = "<!-- n: sigma config/config.yaml mnist_dpsinkhorn_eps10 3 -->0.999<!-- /n -->"
    rendered = docblocks.render_page(sentence, ROOT)
    assert "0.999" not in rendered and rendered.endswith("<!-- /n -->")
    with pytest.raises(ValueError, match="unknown quoted number 'sigmas'"):
        docblocks.value("sigmas config/config.yaml mnist_dpsinkhorn_eps10 3", ROOT)


def test_a_quoted_dpmerf_sigma_and_epsilon_are_its_one_release():
    """DP-MERF's σ is the one-release noise multiplier its training uses (q = 1, one
    step), equal to the committed ledger's, and its ε is that release's."""
    ledger = json.loads(
        (ROOT / "results-paper-scale/dpmerf-cpu/mnist_dpmerf/privacy.json").read_text()
    )
    sigma = docblocks.value("sigma config/config.yaml mnist_dpmerf 4", ROOT)
    assert sigma == f"{ledger['noise_multiplier']:.4f}"
    spec = experiment(load_config([ROOT / "config/config.yaml"]), "mnist_dpmerf")
    eps = compute_epsilon(merf_noise_multiplier(spec), 1.0, 1, spec["delta"], "rdp")
    assert docblocks.value("epsilon config/config.yaml mnist_dpmerf 3", ROOT) == f"{eps:.3f}"
    with pytest.raises(ValueError, match="mnist_dpmerf: method dpmerf has no DP-Sinkhorn"):
        budget_of(spec, 60000)


def test_a_quoted_score_is_seed_0_or_the_mean_and_std_over_the_seeds():
    """``score SET EXP METRIC`` quotes seed 0; with ``mean`` / ``std`` the mean and sample
    std (ddof 1) over every seed's file, as README's Table 1 gives them."""
    folder = ROOT / "results-paper-scale/mnist-perrow-h100/mnist_perrow"
    fids = [json.loads(p.read_text())["fid"] for p in sorted(folder.glob("fid_seed*.json"))]
    cnn = [100 * json.loads(p.read_text())["accuracy"] for p in folder.glob("acc_cnn_seed*.json")]
    assert len(fids) == len(cnn) == 5
    args = "score results-paper-scale/mnist-perrow-h100 mnist_perrow"
    mean, std = sum(fids) / 5, (sum((f - sum(fids) / 5) ** 2 for f in fids) / 4) ** 0.5
    assert docblocks.value(f"{args} fid", ROOT) == f"{fids[0]:.1f}"
    assert docblocks.value(f"{args} fid mean", ROOT) == f"{mean:.1f}"
    assert docblocks.value(f"{args} fid std", ROOT) == f"{std:.1f}"
    assert docblocks.value(f"{args} cnn mean", ROOT) == f"{sum(cnn) / 5:.1f}"


def test_readme_quotes_the_times_of_its_two_commands():
    (kind, sets, _), *_ = [b for b in docblocks.blocks(README) if b[0].startswith("timings")]
    assert kind == "timings totals" and "results-paper-scale/quick-cpu" in sets.split()
    block = docblocks.render(kind, sets, ROOT)
    assert "| `make run` " in block and "| `make test` " in block


def test_an_unknown_block_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown generated block 'tables'"):
        docblocks.render("tables", "x", ROOT)
    with pytest.raises(ValueError, match="ends with <!-- end table1 -->"):
        docblocks.blocks("<!-- timings: a -->\nx\n<!-- end table1 -->")


#: endings of file names, which the docs also write in backticks
FILE_SUFFIXES = {
    "py",
    "md",
    "json",
    "jsonl",
    "yaml",
    "csv",
    "tsv",
    "npz",
    "pt",
    "pth",
    "txt",
    "smk",
    "sh",
    "png",
    "pdf",
    "tex",
    "toml",
    "lock",
    "log",
    "html",
}


def _resolves(name: str) -> bool | None:
    """Whether a dotted name in the docs exists: inside dpsinkhorn when its first part is a
    dpsinkhorn module, else in the importable module it names; None when it names neither
    (a JSON key, a file)."""
    parts = name.removeprefix("dpsinkhorn.").split(".")
    package = Path(importlib.import_module("dpsinkhorn").__file__).parent
    ours = (package / parts[0]).is_dir() or (package / f"{parts[0]}.py").is_file()
    prefix = "dpsinkhorn." if ours else ""
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(prefix + ".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False if ours else None


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dotted_names_in_the_docs_exist(page):
    text = page.read_text()
    names = set(re.findall(r"`((?:[a-z_]+\.)+[A-Za-z_][A-Za-z0-9_]*)[`(\[]", text))
    code = {n for n in names if n.rsplit(".", 1)[1] not in FILE_SUFFIXES}
    missing = sorted(n for n in code if _resolves(n) is False)
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {', '.join(missing)}"


def test_timings_table_of_a_set(tmp_path):
    """Whole commands, then each experiment's training and evaluation, then step rates; a
    ``totals`` table keeps the whole commands; a line per set names its device and date."""
    fileio.write_json(
        tmp_path / "provenance.json",
        {
            "device": "a CPU",
            "date": "2026-01-02",
            "wall_seconds": {"make run (install included)": 1860.0},
            "experiments": {"e": {"train_seconds": 63.2, "evaluate_cpu_wall_seconds": 120.0}},
        },
    )
    fileio.write_json(
        tmp_path / "step_rates.json",
        {
            "rates": [
                {
                    "dataset": "mnist",
                    "batch_size": 50,
                    "runs": 8,
                    "steps_per_s": 114.84,
                    "options": "cuda_graphs",
                }
            ]
        },
    )
    rows = timings.timings_table([tmp_path]).splitlines()
    name = tmp_path.name
    assert rows[2:6] == [
        f"| `make run` (install included) | 31.0 min | `{name}` |",
        f"| train `e` | 63 s | `{name}` |",
        f"| evaluate `e` | 2.0 min | `{name}` |",
        f"| training, mnist B = 50, 8 runs in one sweep (cuda_graphs) | 115 steps/s | `{name}` |",
    ]
    assert rows[-1] == f"- `{name}`: a CPU, 2026-01-02."
    assert timings.timings_table([tmp_path], totals=True).splitlines()[2:4] == [rows[2], ""]
