"""Accounting across releases, per private data source: the composed ε of a run's DP
releases (:func:`dataset_summary`), of every training the data's record lists
(:func:`trainings_summary`), and the worst-off person's ε from the per-user record store
(:func:`individual_summary`). Reads only ledgers and records' public settings, so the
summary belongs to the release; counts from private data go to ``curator`` lines only.
docs/PRIVACY.md says what each ε means."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    dataset_of,
    datasets,
    experiment_dir,
    is_private,
    load_config,
    prepared_folder_of,
    trained_experiments,
)
from dpsinkhorn.config.targets import privacy_summary_file
from dpsinkhorn.privacy import record_store
from dpsinkhorn.privacy import trainings as record
from dpsinkhorn.report.common import format_g, no_guarantee

# privacy.accounting (dp-accounting, scipy: seconds to import) is imported where it is used:
# every Snakemake start imports this module (common.smk, through report.captions).

#: Ledger keys the composition reads.
LEDGER_KEYS = ("q", "noise_multiplier", "steps", "delta", "epsilon", "accountant", "guarantee")
#: Relative tolerance between a ledger's ε and the ε recomputed from its (q, z, steps).
EPSILON_RTOL = 1e-6


def check_ledger_record(ledger: dict, path: Path) -> dict:
    """A DP ledger's content, checked: ``private: true``, the keys the composition reads,
    and an ε that is that of one (q, z, steps, δ) mechanism (ValueError naming ``path``;
    a run that changed σ on resume is refused)."""
    if ledger.get("private") is not True:
        raise ValueError(f"{path}: not a DP ledger (private is {ledger.get('private')!r})")
    missing = [k for k in LEDGER_KEYS if k not in ledger]
    if missing:
        raise ValueError(f"{path}: missing key {missing[0]!r}")
    numbers = [ledger[k] for k in ("noise_multiplier", "q", "steps", "delta", "epsilon")]
    if not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in numbers):
        raise ValueError(f"{path}: q, noise_multiplier, steps, delta, epsilon must be positive")
    kind = str(ledger["accountant"]).split(" ", 1)[0]
    from dpsinkhorn.privacy.accounting import compute_epsilon  # at use: see the imports

    again = compute_epsilon(
        ledger["noise_multiplier"], ledger["q"], int(ledger["steps"]), ledger["delta"], kind
    )
    if not math.isclose(again, float(ledger["epsilon"]), rel_tol=EPSILON_RTOL):
        raise ValueError(
            f"{path}: epsilon {ledger['epsilon']} is not that of its q, noise_multiplier and "
            f"steps ({again:.6g} by {kind}); its run had several mechanisms"
        )
    return ledger


def dataset_summary(config: Mapping, results: Path, dataset: str | list[str]) -> dict:
    """The releases of one dataset (or of several datasets read from the same private
    source: :func:`data_source`), their composed ε at the largest δ any of them claims."""
    names_of = [dataset] if isinstance(dataset, str) else list(dataset)
    dataset = "+".join(names_of)
    tried = [e for e in trained_experiments(config) if dataset_of(config, e) in names_of]
    names = [e for e in tried if is_private(config, e)]
    paths = {e: experiment_dir(config, results, e) / "privacy.json" for e in names}
    ledgers = {e: check_ledger_record(fileio.read_json(p), p) for e, p in paths.items()}
    delta = max((float(x["delta"]) for x in ledgers.values()), default=None)
    summary: dict = {
        "dataset": dataset,
        "releases": len(names),
        "release_epsilons": {e: float(x["epsilon"]) for e, x in ledgers.items()},
        "configurations_tried": len(tried),
        "configurations": tried,
        "mechanism": "Poisson-subsampled Gaussian, add/remove-one adjacency; every step of "
        "every release composed (RDP, dp-accounting)",
        "delta": delta,
        "epsilon_composed": None,
    }
    if ledgers:
        from dpsinkhorn.privacy.accounting import composed_epsilon  # at use: see the imports

        eps = composed_epsilon(record.mechanisms(ledgers.values()), delta)
        terms = [
            (x["steps"], x.get("poisson_overflow_probability_per_step", 0.0))
            for x in ledgers.values()
        ]
        summary["epsilon_composed"] = eps
        # The coupling bound of each ledger's delta_total, over all steps of all releases.
        summary["delta_total"] = delta + record.overflow_delta(terms, eps)
    public = [e for e, x in ledgers.items() if no_guarantee(x)]
    if public:
        summary["no_guarantee"] = public
    warnings = []
    if len(names) > 1:
        warnings.append(
            f"{len(names)} DP releases were trained on {dataset}: publishing all of them costs "
            f"epsilon = {summary['epsilon_composed']:.4g} (composed), not the epsilon of each"
        )
    if len(tried) > len(names) or len(names) > 1:
        warnings.append(
            f"{len(tried)} configurations were trained on {dataset}; choosing among them used "
            "the private data, which no ledger counts"
        )
    if public:
        warnings.append(f"no guarantee for {', '.join(public)}: the noise seed was public")
    summary["warnings"] = warnings
    return summary


def trainings_summary(config: Mapping, names: list[str], summary: dict) -> dict:
    """Every DP training recorded for the datasets ``names`` (one private source), composed
    at the largest δ of the record and of ``summary`` (:func:`dataset_summary`); adds a
    warning to ``summary["warnings"]`` when the source was trained more often than released."""
    found: list[dict] = []
    unread = []
    for name in names:
        path = source_record(config, name)
        if path is None:
            unread.append(str(prepared_train_file(config, name)))
            continue
        found += record.trainings(record.read(path)) if path.is_file() else []
    out = record.composed(found, summary["delta"])
    private = [t for t in found if t["private"]]
    out["experiments"] = sorted({t["experiment"] for t in private})
    records = Path(config["data_dir"]) / record.RECORD_DIR
    folders = {
        record.output_folder(t, records) for t in private if t.get("out") or t.get("out_rel")
    }
    out["run_folders"] = len({str(Path(f).parent) for f in folders})
    out["note"] = (
        "every DP training recorded for this data (any run folder or config; unfinished ones "
        "at their planned steps), composed (RDP) at the largest delta"
    )
    if unread:
        out["not_read"] = unread
    if out["trainings"] > summary["releases"]:
        summary["warnings"].append(
            f"{summary['dataset']} was trained {out['trainings']} times with DP "
            f"({out['finished']} finished, {out['unfinished']} unfinished, {out['retrained']} "
            f"retrained) but this run releases {summary['releases']}: everything trained on it "
            f"costs epsilon = {out['epsilon_composed']:.4g} (composed at delta "
            f"{out['delta']:g}), not the epsilon of the releases"
        )
    return out


def prepared_train_file(config: Mapping, dataset: str) -> Path:
    """The prepared training split of a config's dataset (``<data_dir>/<folder>/train.npz``)."""
    return Path(config["data_dir"]) / prepared_folder_of(config, dataset) / "train.npz"


def source_record(config: Mapping, dataset: str) -> Path | None:
    """The training record file of a config's dataset (``privacy.trainings.record_file``
    of its prepared training split's content; it may not exist yet), or None when that
    split is not prepared (its content, the record's key, cannot be read)."""
    path = prepared_train_file(config, dataset)
    return _record_of(config, *fileio.load_samples(path)) if path.is_file() else None


def _record_of(config: Mapping, images: np.ndarray, labels: np.ndarray) -> Path:
    fingerprint = record.data_fingerprint(images, labels)
    return record.record_file(Path(config["data_dir"]) / record.RECORD_DIR, fingerprint)


def data_source(config: Mapping, dataset: str) -> str:
    """What private data a dataset is: its name for a built-in one, else the path of its
    definition (``datasets.<name>.path``): two own datasets read from the same folder or
    .npz (e.g. at two resolutions) are the same private data and compose."""
    definition = (config.get("datasets") or {}).get(dataset)
    return dataset if definition is None else os.path.normpath(str(definition["path"]))


def individual_summary(
    config: Mapping, names: list[str], summary: dict, results: Path, curator: list[str]
) -> dict | None:
    """The worst-off person's ε over every DP training of the record store that held one
    of the records of the prepared training splits of ``names`` (one private source);
    None when none is prepared. Imports into the store the trainings of the source's event
    record (``privacy.trainings``) that it lacks (a lost store). Adds a warning naming the
    trainings outside this run that held its records; appends to ``curator`` the counts
    (computed from the private data, never published)."""
    store = record_store.RecordStore(record_store.store_root(config))
    keys = []
    for name in names:
        path = prepared_train_file(config, name)
        if not path.is_file():
            continue
        images, labels = fileio.load_samples(path)
        fps = record_store.fingerprints(store.key(), images)
        old = _record_of(config, images, labels)
        if old.is_file():
            record_store.import_record(store, record.trainings(record.read(old)), lambda f=fps: f)
        keys.append(fps)
    if not keys:
        return None
    found = record_store.individual(store, np.unique(np.concatenate(keys)), summary["delta"])

    def named(t: record_store.Training) -> str:
        out = Path(str(t.meta.get("out") or "?"))
        return f"{t.meta.get('experiment', '?')} (run {out.parent.name})"

    # This run's trainings: those of its run folder's name (a copied or moved run is the
    # same run; its summary does not change with the folder it lies in).
    outside = [
        t for t in found["trainings"] if Path(str(t.meta.get("out"))).parent.name != results.name
    ]
    out = {
        "epsilon_worst_off": found["epsilon_worst_off"],
        "delta": found["delta"],
        "delta_total": found["delta_total"],
        "mechanism": record_store.MECHANISM,
        "trainings": len(found["trainings"]),
        "worst_off_in": [named(t) for t in found["worst_off"]],
        "other_runs": [named(t) for t in outside],
        "note": "epsilon of the person whose records were in the most costly set of DP "
        "trainings (any data_dir, run folder or machine whose record store was merged "
        "here); release_epsilons are per release, each alone",
    }
    dataset = summary["dataset"]
    if found["public_seed"]:
        out["no_guarantee"] = [named(t) for t in found["public_seed"]]
        summary["warnings"].append(
            f"no guarantee for a person whose records {', '.join(out['no_guarantee'])} "
            f"held: the noise seed was public; the worst-off person's epsilon counts that "
            "noise as secret"
        )
    if outside:
        summary["warnings"].append(
            f"{len(outside)} DP training(s) outside this run held records of {dataset}: "
            f"{', '.join(out['other_runs'])}; the worst-off person's epsilon is "
            f"{found['epsilon_worst_off']:.4g} (composed at delta {found['delta']:g}), "
            "not the epsilon of this run's releases"
        )
    curator.append(
        f"{dataset}: {found['shared']} record(s) lie in more than one DP training; "
        + "; ".join(f"{named(t)} held {found['overlap'][t.id]}" for t in found["trainings"])
        + " (counts from the private data: not in privacy_summary.json, do not publish)"
    )
    return out


def privacy_summary(config: Mapping, results: str | Path, curator: list[str] | None = None) -> dict:
    """``{"datasets": [dataset_summary, ...]}``, one per private data source the config
    uses (datasets sharing a source are summarised together, named ``a+b``); each with
    ``individual`` (:func:`individual_summary`). ``curator`` gets what only the curator
    may read."""
    curator = [] if curator is None else curator
    results = Path(results)
    sources: dict[str, list[str]] = {}
    for d in datasets(config):
        sources.setdefault(data_source(config, d), []).append(d)
    out = []
    for names in sources.values():
        summary = dataset_summary(config, results, names)
        summary["all_trainings"] = trainings_summary(config, names, summary)
        person = individual_summary(config, names, summary, results, curator)
        if person is not None:
            summary["individual"] = person
        out.append(summary)
    return {"datasets": out}


def summary_markdown(summary: Mapping) -> list[str]:
    """The reproduction.md section: one row per dataset, then the warnings."""
    lines = [
        "## Privacy across releases",
        "",
        "Publishing several DP releases trained on the same data composes their ε "
        "(RDP, every step of every release); `privacy_summary.json` has the details.",
        "",
        "| dataset | DP releases | ε per release | ε of all (composed) | δ | configurations "
        "tried | DP trainings recorded | ε of every training | ε of the worst-off person |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in summary["datasets"]:
        each = ", ".join(f"{e}: {v:.4g}" for e, v in d["release_epsilons"].items()) or "–"
        eps, delta = format_g(d["epsilon_composed"], spec=".4g"), format_g(d["delta"])
        every = d.get("all_trainings") or {}
        eps_all = format_g(every.get("epsilon_composed"), spec=".4g")
        person = format_g((d.get("individual") or {}).get("epsilon_worst_off"), spec=".4g")
        lines.append(
            f"| {d['dataset']} | {d['releases']} | {each} | {eps} | {delta} | "
            f"{d['configurations_tried']} | {every.get('trainings', '–')} | {eps_all} | "
            f"{person} |"
        )
    warnings = [w for d in summary["datasets"] for w in d["warnings"]]
    lines += [""] + [f"**Warning:** {w}." for w in warnings] + ([""] if warnings else [])
    return lines


def _cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    out = args.out or privacy_summary_file(args.results)
    # Counts from the private data are not printed: this runs as a workflow job, whose log
    # is kept beside the run; `dpsinkhorn release` shows them to the curator.
    summary = privacy_summary(config, args.results)
    fileio.write_json(out, summary)
    print(out)
    return 0


def individual_lines(summary: Mapping) -> list[str]:
    """How ``dpsinkhorn release`` states each dataset's ε: per release, and the
    worst-off person's over every DP training that held their records."""
    lines = []
    for d in summary["datasets"]:
        each = ", ".join(f"{e} {v:.4g}" for e, v in d["release_epsilons"].items()) or "none"
        person = d.get("individual") or {}
        eps = person.get("epsilon_worst_off")
        total = person.get("delta_total")
        delta = (
            f"{total:g}"
            if total is not None
            else f"{person.get('delta'):g} plus an overflow charge a training did not record"
        )
        said = "unknown" if eps is None else f"{eps:.4g} at delta {delta}"
        lines.append(
            f"{d['dataset']}: epsilon per release: {each}; the worst-off person's epsilon "
            f"(every DP training that held their records, {person.get('trainings', 0)} "
            f"training(s)): {said}"
        )
        lines += [
            f"WARNING: {w}"
            for w in d["warnings"]
            if "outside this run" in w or w.startswith("no guarantee for a person")
        ]
    return lines


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "privacy-summary", help="per dataset: DP releases, their composed epsilon, configs tried"
    )
    p.add_argument("--config", nargs="+", default=["config/config.yaml"])
    p.add_argument("--results", required=True, help="results/<run>")
    p.add_argument("--out", help="default: <results>/privacy_summary.json")
    p.set_defaults(handler=_cli)
