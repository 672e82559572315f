"""Committed results sets: ``dpsinkhorn report results-set --dir results-paper-scale/<name>``
writes ``<set>/table1.{md,csv}``, a row per experiment of the set's config with a folder in
the set (files: docs/CONTRACTS.md); each ledger must match its experiment."""

from __future__ import annotations

import argparse
import math
from collections.abc import Collection, Sequence
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    PRIVATE_METHODS,
    classifiers_of,
    experiment,
    load_config,
    table1_experiments,
)
from dpsinkhorn.report.common import (
    CLIPPING_TEXT,
    DATASET_TITLES,
    METRIC_TITLES,
    METRICS,
    NO_GUARANTEE,
    ROW_LABELS,
    Row,
    csv_columns,
    csv_record,
    csv_text,
    epsilon_text,
    md_table,
    mechanism_note,
    mechanism_tag,
    paper_number,
    read_epsilons,
    read_scores,
    require_keys,
    sound_epsilons,
)
from dpsinkhorn.report.paper import PAPER_DP, PAPER_EPSILON, sok_note, table1_paper_values

PROVENANCE = "provenance.json"
#: Ledger keys that must equal the config's experiment for its row label to be right.
LEDGER_KEYS = ("sigma", "steps", "clipping", "clip", "batch_size", "delta")
#: A DP-MERF row's: config key -> ledger key (its ``steps`` counts the one release).
MERF_LEDGER_KEYS = {
    "sigma": "sigma",
    "steps": "generator_steps",
    "batch_size": "batch_size",
    "delta": "delta",
}
#: Root of the committed sets, relative to the repository root.
SETS_DIR = "results-paper-scale"
MISSING = "missing"
#: Beside a sound ε whose ledger says there is no guarantee (public noise seed: ``none``) or
#: has no ``guarantee`` field (``unknown``).
MARKS = {"none": "†", "unknown": "‡"}


def guarantee_status(privacy: dict) -> tuple[str, str]:
    """(status, the ledger's text) of a DP row's ``guarantee``: ``none`` (public noise seed: ε
    bounds nothing), ``unknown`` (no field) or ``sound``; ("", "") for a row that is not DP."""
    if not privacy:
        return "", ""
    text = privacy.get("guarantee")
    if not isinstance(text, str) or not text.strip():
        return "unknown", "unknown"
    return ("none" if text.startswith(NO_GUARANTEE) else "sound"), text


def _sound_cells(row: Row) -> list[str]:
    """Sound ε by RDP and by PLD, marked with :data:`MARKS`; ∞ twice for a non-DP row."""
    if not row.privacy:
        return [epsilon_text(row.epsilon, False)] * 2
    eps, status = sound_epsilons(row.privacy), guarantee_status(row.privacy)[0]
    mark = f" {MARKS[status]}" if status in MARKS else ""
    return [f"{eps.get(a, math.nan):.2f}{mark}" for a in ("rdp", "pld")]


def guarantee_notes(rows: Sequence[Row]) -> list[str]:
    """Footnotes of the marks: which rows' ε carry no guarantee, and the ledger's reason."""
    none: dict[str, list[str]] = {}
    unknown = []
    for r in rows:
        status, text = guarantee_status(r.privacy)
        if status == "none":
            none.setdefault(text, []).append(f"`{r.exp_name}`")
        elif status == "unknown":
            unknown.append(f"`{r.exp_name}`")
    notes = [
        f"**{MARKS['none']} No privacy guarantee for {', '.join(names)}: their ledgers "
        f'say "guarantee": "{reason}". With a public noise seed anyone can subtract the '
        "noise; their sound ε is what the same mechanism would spend with a secret seed, "
        "not a bound on what the release reveals.**"
        for reason, names in none.items()
    ]
    if unknown:
        notes.append(
            f"**{MARKS['unknown']} Unknown guarantee for {', '.join(unknown)}: their "
            'ledgers have no "guarantee" field, so whether the noise seed was secret is not '
            "recorded; their ε carries no guarantee until it is.**"
        )
    return notes


def load_provenance(set_dir: Path) -> dict:
    """``<set>/provenance.json``; a one-line error names a missing file or key."""
    path = set_dir / PROVENANCE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no provenance file; a results set needs one")
    return require_keys(
        fileio.read_json(path), ("name", "device", "commit", "config", "experiments"), path
    )


def set_config(set_dir: Path, provenance: dict) -> dict:
    """The set's config (path from the repository root, else from the working directory)."""
    path = set_dir.resolve().parents[1] / provenance["config"]
    if not path.is_file() and Path(provenance["config"]).is_file():
        path = Path(provenance["config"])
    return load_config([path])


def load_set(set_dir: Path, config_files: Sequence[str | Path] | None = None) -> tuple:
    """(provenance, config, Table 1 rows) of a set, by ``config_files`` or the set's config."""
    provenance = load_provenance(set_dir)
    config = load_config(config_files) if config_files else set_config(set_dir, provenance)
    return provenance, config, set_rows(config, set_dir)


def _check_ledger(spec: dict, privacy: dict, path: Path) -> None:
    merf = spec["method"] == "dpmerf"  # its ledger's steps are releases, no clipping
    for key in MERF_LEDGER_KEYS if merf else LEDGER_KEYS:
        want, got = spec.get(key), privacy.get(MERF_LEDGER_KEYS.get(key, key) if merf else key)
        if want is None:  # solved by the run (σ or steps from target ε): any value
            continue
        same = (
            math.isclose(float(want), float(got))
            if isinstance(want, int | float) and isinstance(got, int | float)
            else want == got
        )
        if not same:
            raise ValueError(
                f"{path}: {key} {got!r} differs from the config's {want!r} for experiment "
                f"{spec['name']}; this ledger does not belong to that row"
            )


def set_rows(config: dict, set_dir: Path) -> list[Row]:
    """Table 1 rows of the experiments present in the set, seeds counted per cell."""
    rows = []
    for (dataset, kind), name in table1_experiments(config).items():
        exp_dir = set_dir / name
        if not exp_dir.is_dir():
            continue
        spec = experiment(config, name)
        row = Row(ROW_LABELS[kind], dataset, f"results set {set_dir.name}")
        row.exp_name, row.seeds = name, len(config["seeds"])
        read_scores(row, exp_dir, config["seeds"], classifiers_of(config, dataset), True)
        ledger = exp_dir / "privacy.json"
        if spec["method"] in PRIVATE_METHODS and not ledger.is_file():
            raise FileNotFoundError(f"{ledger}: a DP row of a results set needs its ledger")
        read_epsilons(row, spec, ledger)
        if row.privacy:
            _check_ledger(spec, row.privacy, ledger)
        row.paper = dict(zip(METRICS, table1_paper_values(dataset, kind, spec), strict=True))
        rows.append(row)
    return rows


def _cell(row: Row, metric: str) -> str:
    n, total = row.counts.get(metric, 0), row.seeds
    mean, std = row.mean.get(metric), row.std.get(metric)
    if mean is None:
        return f"{MISSING} (0/{total} seeds)"
    text = f"{mean:.1f}" + (f" ± {std:.1f}" if n > 1 and std is not None else "")
    return f"{text} ({n}/{total} seed{'s' if total > 1 else ''})"


def cpu_fid(set_dir: Path) -> dict[str, dict]:
    """``cpu-fid/<experiment>.json`` files of the set (small-sample FID, not Table 1's)."""
    keys = ("fid", "num_images_a", "num_images_b")
    paths = sorted((set_dir / "cpu-fid").glob("*.json"))
    return {p.stem: require_keys(fileio.read_json(p), keys, p) for p in paths}


def _guarantee_clause(row: Row) -> str:
    """``" (no guarantee: <ledger's reason>)"`` / ``" (unknown guarantee)"``; '' if sound."""
    status, text = guarantee_status(row.privacy)
    clauses = {
        "none": f' (no guarantee; ledger: "{text}")',
        "unknown": " (unknown guarantee: the ledger has no guarantee field)",
    }
    return clauses.get(status, "")


def epsilon_meaning(rows: Sequence[Row], provenance: dict) -> list[str]:
    """Markdown lines of "What the paper's ε = 10 means", from the paper-setting rows."""
    sound = {
        id(r): sound_epsilons(r.privacy)
        for r in rows
        # DP-Sinkhorn rows at the paper's setting (DP-MERF's quoted row has no convention)
        if r.privacy and r.paper.get("acc_cnn") is not None and r.privacy.get("method") != "dpmerf"
    }
    pairs = [r for r in rows if sound.get(id(r))]
    if not pairs:
        return []
    lines = [
        "## What the paper's ε = 10 means",
        "",
        "The paper reports its setting as ε = 10, counted under its own convention "
        "(`compute_rdp(q, σ, steps·B)`), which depends on σ, q and the steps only and ignores "
        "how the gradients were clipped. The rows below ran that setting; their sound ε is "
        "the accountant's for the mechanism each one ran (Poisson-subsampled Gaussian, "
        "add/remove-one adjacency, δ from the ledger):",
        "",
    ]
    commands = provenance.get("experiments", {})
    for r in pairs:
        eps = sound[id(r)]
        title = DATASET_TITLES.get(r.dataset, r.dataset)
        clip = CLIPPING_TEXT.get(r.privacy.get("clipping"), r.privacy.get("clipping"))
        accs = ", ".join(
            f"{METRIC_TITLES[m]} {_cell(r, m)} (paper {r.paper[m]:g})"
            for m in ("acc_logreg", "acc_mlp", "acc_cnn")
            if r.paper.get(m) is not None
        )
        lines.append(
            f"- {title}, `{r.exp_name}`, {clip}: noise multiplier "
            f"{r.privacy.get('noise_multiplier', float('nan')):.3g}, sound ε "
            f"{eps.get('rdp', math.nan):.2f} (RDP) / {eps.get('pld', math.nan):.2f} (PLD)"
            f"{_guarantee_clause(r)}, paper-convention ε {r.epsilon_paper:.2f}; {accs}."
        )
        command = commands.get(r.exp_name, {}).get("command")
        if command:
            lines.append(f"  Reproduce: `{command}`")
    measured = [r for r in pairs if r.mean.get("acc_cnn") is not None]
    if len(measured) > 1:
        best = min(measured, key=lambda r: abs(r.mean["acc_cnn"] - r.paper["acc_cnn"]))
        lines += [
            "",
            f"Of these, the row closest to the paper's CNN accuracy "
            f"({best.paper['acc_cnn']:g}%) is `{best.exp_name}` "
            f"({best.mean['acc_cnn']:.1f}%), whose sound ε is "
            f"{best.epsilon:.4g} at δ = {best.privacy.get('delta', math.nan):g}"
            f"{_guarantee_clause(best)}.",
        ]
    return lines + [""]


def _paper_rows(rows: Sequence[Row], lead: Sequence[str]) -> list[list[str]]:
    """The paper's Table 1 DP-Sinkhorn row of each dataset of ``rows``: the cells ``lead``
    (the first formatted with the dataset's title), the claimed ε, the paper's values."""
    datasets = [d for d in dict.fromkeys(r.dataset for r in rows) if d in PAPER_DP]
    return [
        [lead[0].format(DATASET_TITLES.get(d, d)), *lead[1:], f"{PAPER_EPSILON:g} (claimed)"]
        + [f"{v:g}" for v in PAPER_DP[d]]
        for d in datasets
    ]


def markdown(rows: Sequence[Row], config: dict, set_dir: Path, provenance: dict) -> str:
    """The set's Table 1 rows, provenance, missing cells, small-sample FID, ε = 10 section."""
    covered = {r.exp_name for r in rows}
    absent = [n for n in table1_experiments(config).values() if n not in covered]
    prov = dict(provenance, config_changes="; ".join(provenance.get("config_changes") or []))
    said = {  # optional provenance keys: how the sentence says them
        key: text.format(prov[key]) if prov.get(key) else ""
        for key, text in [
            ("date", ", {}"),
            ("config_changes", " with {}"),
            ("removed", "; removed before committing: {}"),
            ("added", "; added after the run: {}"),
        ]
    }
    lines = [
        f"# Table 1 rows from the results set `{prov['name']}`",
        "",
        f"**Provenance.** {prov.get('what', 'outputs of a run')}: real outputs of this project's "
        f"code at commit `{prov['commit']}` on {prov['device']}{said['date']}, config "
        f"`{prov['config']}`{said['config_changes']}. Commands and generator checksums: "
        f"`provenance.json`{said['removed']}{said['added']}. Rendered by `dpsinkhorn report "
        f"results-set --dir {SETS_DIR}/{set_dir.name}`.",
        "",
        f"Each cell is mean ± std over the seeds whose result file is in the set (sample std, "
        f"ddof=1; no ± for one seed), with the count of the config's {len(config['seeds'])} "
        f"seeds; `{MISSING}` = no seed measured. Nothing is filled in. Accuracy in % of "
        f"{config['evaluation']['num_samples']} synthetic samples per seed, tested on the real "
        "test set; `(paper X)` is the paper's Table 1.",
        "",
    ]
    official = [r.dataset for r in rows if r.method == ROW_LABELS["sound_official"]]
    for note in [*guarantee_notes(rows), mechanism_note(rows), sok_note(official)]:
        lines += [note, ""] if note else []
    header = ["Dataset", "Row", "Experiment", "ε sound (RDP)", "ε sound (PLD)", "ε paper conv."]
    table = []
    for r in rows:
        cells = [DATASET_TITLES.get(r.dataset, r.dataset), r.method, f"`{r.exp_name}`"]
        cells += [*_sound_cells(r), epsilon_text(r.epsilon_paper, False)]
        for m in METRICS:
            paper = r.paper.get(m)
            cells.append(_cell(r, m) + ("" if paper is None else f" (paper {paper_number(paper)})"))
        table.append(cells)
    table += _paper_rows(rows, ["{}", "DP-Sinkhorn as reported in the paper", "–", "–", "–"])
    lines += md_table([*header, *(METRIC_TITLES[m] for m in METRICS)], table)
    if absent:
        names = ", ".join(f"`{n}`" for n in absent)
        lines += ["", f"Not in this set (not run at paper scale here): {names}."]
    fids = cpu_fid(set_dir)
    if fids:
        lines += [
            "",
            "## Small-sample FID on CPU (not the paper's protocol)",
            "",
            "FID between samples of the generator and a seeded random subset of the real test "
            "set, of the sizes below, with pytorch-fid's Inception weights. The paper's protocol "
            "is 60,000 generated images against the full 10,000-image test set; a FID from "
            "fewer images is biased upwards and is NOT comparable with the paper's FID or with "
            "Table 1's FID column, which stays missing above. Command: `cpu-fid/README.md`.",
            "",
            "| Experiment | FID ↓ | generated images | real test images | sqrtm |",
            "|---|---|---|---|---|",
        ]
        for name, data in fids.items():
            lines.append(
                f"| `{name}` | {data['fid']:.1f} | {data['num_images_a']} | "
                f"{data['num_images_b']} | {data.get('sqrtm', '?')} |"
            )
    lines += [""] + epsilon_meaning(rows, provenance)
    figures = sorted((set_dir / "figures").glob("*.png"))
    if figures:
        lines += ["## Samples", ""]
        lines += [f"![{p.stem}](figures/{p.name})" for p in figures] + [""]
    return "\n".join(lines).rstrip() + "\n"


def render(set_dir: str | Path, config_files: Sequence[str | Path] | None = None) -> list[Path]:
    """Write ``<set>/table1.{md,csv}`` from the set's files; return their paths."""
    set_dir = Path(set_dir)
    provenance, config, rows = load_set(set_dir, config_files)
    if not rows:
        raise ValueError(f"{set_dir}: no folder of a Table 1 experiment of {provenance['config']}")
    written = [set_dir / "table1.md", set_dir / "table1.csv"]
    fileio.write_text(written[0], markdown(rows, config, set_dir, provenance))
    fileio.write_text(written[1], set_csv(rows))
    return written


def readme_table(set_dir: str | Path) -> str:
    """README.md's Table 1 of a committed set: its rows, the paper's, the marks' footnotes."""
    rows = load_set(Path(set_dir))[2]
    table = []
    for r in rows:
        title = DATASET_TITLES.get(r.dataset, r.dataset)
        tag = mechanism_tag(r.privacy) if r.privacy else ""
        sound = _sound_cells(r)
        cells = [
            f"{title} {r.method} (`{r.exp_name}`{', ' + tag if tag else ''})",
            " / ".join(sound) if r.privacy else sound[0],
            epsilon_text(r.epsilon_paper, False),
        ]
        table.append(cells + [_cell(r, m) for m in METRICS])
    table += _paper_rows(rows, ["{} DP-Sinkhorn, the paper's Table 1", "–"])
    header = ["Row", "sound ε (RDP / PLD)", "paper conv. ε", *(METRIC_TITLES[m] for m in METRICS)]
    lines = md_table(header, table)
    notes = guarantee_notes(rows)
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def set_csv(rows: Sequence[Row]) -> str:
    """:func:`report.common.to_csv` with a last column ``guarantee`` (the ledger's text)."""
    records = [csv_record(r) | {"guarantee": guarantee_status(r.privacy)[1]} for r in rows]
    return csv_text((*csv_columns(), "guarantee"), records, digits=4)


def committed_sets(root: str | Path = ".") -> list[Path]:
    """Results sets under ``<root>/results-paper-scale/`` (those with a provenance file)."""
    return sorted(p.parent for p in Path(root).glob(f"{SETS_DIR}/*/{PROVENANCE}"))


def epsilon_meaning_of_sets(root: str | Path, datasets: Collection[str]) -> list[str]:
    """The ε = 10 section of every committed set under ``root`` with a row of ``datasets``."""
    lines = []
    for set_dir in committed_sets(root):
        provenance, _, rows = load_set(set_dir)
        if not any(r.dataset in datasets for r in rows):
            continue
        section = epsilon_meaning(rows, provenance)
        if section:
            measured = (
                f"Measured by this project's code at commit `{provenance['commit']}` on "
                f"{provenance['device']}; files in `{SETS_DIR}/{set_dir.name}/`."
            )
            lines += [section[0] + f" (results set `{set_dir.name}`)", "", measured, *section[1:]]
    return lines


def _cli(args: argparse.Namespace) -> int:
    for path in render(args.dir, args.config):
        print(path)
    return 0


def register(reports: argparse._SubParsersAction) -> None:
    """``dpsinkhorn report results-set --dir DIR [--config FILES]``."""
    p = reports.add_parser(
        "results-set",
        help="Table 1 rows of a committed results set (results-paper-scale/<name>): "
        "<dir>/table1.{md,csv}",
    )
    p.add_argument("--dir", required=True, help="the set's folder (holds provenance.json)")
    p.add_argument(
        "--config", nargs="+", default=None, help="config file(s); default: the set's own"
    )
    p.set_defaults(handler=_cli)
