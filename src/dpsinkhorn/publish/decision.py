"""The release's decision and writing: ``dpsinkhorn release``, ``release-manifest``.

:func:`decide` lists a run's files from the config alone and proves each from its ledger
(``publish.proofs``), reading every file once; nothing else is published. :func:`release`
writes the checked bytes to a temporary folder and renames it into place (docs/PRIVACY.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    NONPRIVATE,
    dataset_of,
    experiment_dir,
    load_config,
    prepared_folder_of,
    private_experiments,
)
from dpsinkhorn.config.experiments import experiment_spec
from dpsinkhorn.config.targets import (
    EVALUATION_PHASES,
    EVALUATION_PROGRESS,
    TRAINING_FILES,
    fid_reference_file,
    privacy_summary_file,
    release_manifest_file,
    released_metrics,
    results_dir,
    sample_name,
    score_name,
)
from dpsinkhorn.privacy import trainings
from dpsinkhorn.publish.proofs import (
    ACCEPT_FLAG,
    check_draw,
    check_ledger,
    check_recorded,
    check_score,
    load_verified_generator,
)

MANIFEST = "release_manifest.json"
LEDGER = "privacy.json"
WORKSPACE = "private_workspace"
#: Version of the manifest's (the decision report's) layout.
MANIFEST_VERSION = 2


@dataclass(frozen=True)
class Folder:
    """One DP experiment's folder as the config defines it: what may be published from it.
    ``rel`` is relative to the run ("": trained alone); None ``experiment``/``spec``: not
    checked; ``scores``: metric names, scored against ``test`` (npz) and FID ``reference``;
    ``records``: the training record files that must hold its training."""

    rel: str
    experiment: str | None = None
    seeds: tuple[int, ...] = ()
    num_samples: int = 0
    scores: tuple[str, ...] = ()
    test: Path | None = None
    reference: Path | None = None
    records: tuple[Path, ...] = ()
    spec: dict | None = field(default=None, hash=False, compare=False)


@dataclass
class Published:
    """One file of a release: its path in the run, kind, checked bytes, covering ledgers
    and how it was proven; ``source``: the run's file it stands for, checked again after
    writing against ``source_sha256``."""

    path: str
    kind: str
    data: bytes = field(repr=False)
    ledgers: list[str]
    proof: str
    source: Path
    source_sha256: str


def run_folders(config: Mapping, run: str | Path) -> list[Folder]:
    """The DP folders of a config's run and what each may publish, from the config alone."""
    from dpsinkhorn.report.privacy_summary import source_record  # reads the prepared data

    run = Path(run)
    folders = []
    for exp in private_experiments(config):
        dataset = dataset_of(config, exp)
        prepared = Path(config["data_dir"]) / prepared_folder_of(config, dataset)
        folders.append(
            Folder(
                rel=experiment_dir(config, run, exp).relative_to(run).as_posix(),
                experiment=exp,
                seeds=tuple(config["seeds"]),
                num_samples=int(config["evaluation"]["num_samples"]),
                scores=tuple(released_metrics(config, exp)),
                test=prepared / "test.npz",
                reference=Path(fid_reference_file(run, dataset)),
                records=tuple(p for p in [source_record(config, dataset)] if p is not None),
                spec=json.loads(experiment_spec(config, exp)),
            )
        )
    return folders


def experiment_folder(record_dir: str | Path) -> list[Folder]:
    """An experiment folder trained alone (``dpsinkhorn train --out``, ``api.train``): its
    three training files, no samples, no scores; its training is looked for in every record
    file of ``record_dir`` (where that training appended its events)."""
    return [Folder(rel="", records=tuple(sorted(Path(record_dir).glob("*.jsonl"))))]


def decide(
    run: str | Path,
    folders: Sequence[Folder],
    config: Mapping | None = None,
    accept_no_guarantee: bool = False,
    device: str = "cpu",
    flag: str = ACCEPT_FLAG,
) -> list[Published]:
    """Every file a release of ``run`` publishes, proven (module docstring), or a one-line
    refusal (ValueError / FileNotFoundError naming the file). ``config``: also the run's
    ``privacy_summary.json``; ``device``: where samples are redrawn."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder")
    if not folders:
        raise ValueError(f"{run}: the config has no DP experiment (nothing to publish)")
    out = [p for f in folders for p in _decide_folder(run, f, accept_no_guarantee, device, flag)]
    if config is not None:
        out.append(_decide_summary(run, config, [_rel(f, LEDGER) for f in folders]))
    return out


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the run is not complete)")
    return path.read_bytes()


def _rel(folder: Folder, name: str) -> str:
    return f"{folder.rel}/{name}" if folder.rel else name


def _published(
    folder: Folder, name: str, kind: str, data: bytes, proof: str, source: Path, sha=None
):
    """``source_sha256``: ``sha``, else that of ``data`` (the file is published as read)."""
    sha = sha or fileio.sha256_of_bytes(data)
    return Published(_rel(folder, name), kind, data, [_rel(folder, LEDGER)], proof, source, sha)


def _decide_folder(
    run: Path, folder: Folder, accept_none: bool, device: str, flag: str
) -> list[Published]:
    exp = run / folder.rel
    if (exp / WORKSPACE).exists():
        raise ValueError(
            f"{exp / WORKSPACE}: a private workspace is left (the run is not complete)"
        )
    if folder.experiment is not None:
        _check_nothing_else(exp, folder)
    ledger_path = exp / LEDGER
    ledger_bytes = _read(ledger_path)
    record = check_ledger(ledger_bytes, ledger_path, folder.experiment, accept_none, flag)
    if not folder.records and folder.test is not None:
        raise FileNotFoundError(
            f"{folder.test.with_name('train.npz')}: missing, so the training record that must "
            f"prove {ledger_path} cannot be found (it is keyed by that split's content); "
            "prepare the data again from the same source"
        )
    trained = trainings.finished_into(folder.records, exp)
    recorded = check_recorded(
        record, ledger_bytes, ledger_path, trained, list(folder.records), folder.spec
    )
    proof = f"the ledger: private, ε recomputed, guarantee stated; {recorded}"
    files = [_published(folder, LEDGER, "ledger", ledger_bytes, proof, ledger_path)]
    verified = {}
    checks = (
        ("generator.pt", "generator", "content_sha256"),
        ("train_log.csv", "train_log", "train_log_sha256"),
    )
    for name, kind, key in checks:
        path = exp / name
        data = _read(path)
        if fileio.sha256_of_bytes(data) != record.get(key):
            raise ValueError(
                f"{path}: not the file its training wrote (sha256 differs from {key} in "
                f"{ledger_path}); refusing to publish it"
            )
        verified[name] = data
        files.append(_published(folder, name, kind, data, f"sha256 = ledger's {key}", path))
    samples = {}
    if folder.seeds:
        model = load_verified_generator(verified["generator.pt"], exp / "generator.pt", device)
        samples = {seed: _decide_samples(model, folder, exp, seed) for seed in folder.seeds}
    files += samples.values()
    for metric in folder.scores:
        for seed in folder.seeds:  # a score names the run's sample file by its sha256
            files.append(_decide_score(folder, exp, metric, seed, samples[seed].source_sha256))
    return files


#: Names in a DP folder that are written there but never published (``config.targets``).
NOT_PUBLISHED = (EVALUATION_PHASES, EVALUATION_PROGRESS, WORKSPACE)


def _check_nothing_else(exp: Path, folder: Folder) -> None:
    """Refuse a file in a config's DP folder that no rule writes there (hidden names pass:
    locks, stop notes, writers' temporary files; none is published)."""
    known = {*TRAINING_FILES, *NOT_PUBLISHED, *(sample_name(s) for s in folder.seeds)}
    known |= {score_name(m, s) for m in folder.scores for s in folder.seeds}
    for entry in sorted(exp.iterdir()) if exp.is_dir() else []:
        if not entry.name.startswith(".") and entry.name not in known:
            raise ValueError(
                f"{entry}: no rule writes it into the DP folder {exp} and no ledger covers it; "
                "move it out (refusing: a DP folder holds only what its ledger covers)"
            )


def _decide_samples(model, folder: Folder, exp: Path, seed: int) -> Published:
    """The redraw of one seed (published), after checking the run's file holds that draw;
    its ``source_sha256`` is the run's file's."""
    from dpsinkhorn.evaluate.sample import sample_generator

    name = sample_name(seed)
    path = exp / name
    data = _read(path)
    images, labels = sample_generator(model, folder.num_samples, seed)
    redraw = fileio.samples_bytes(images, labels, str(path))
    if data == redraw:
        proof = f"redrawn from the verified generator (seed {seed}, {len(labels)} samples): equal"
    else:
        proof = check_draw(path, data, images, labels, seed)
    return _published(folder, name, "samples", redraw, proof, path, fileio.sha256_of_bytes(data))


def _decide_score(folder: Folder, exp: Path, metric: str, seed: int, samples_sha: str):
    """A score file, bound to its inputs (:func:`proofs.check_score`)."""
    path = exp / score_name(metric, seed)
    data = _read(path)
    public = folder.reference if metric == "fid" else folder.test
    proof = check_score(path, data, metric, seed, samples_sha, public, folder.test)
    return _published(folder, path.name, "scores", data, proof, path)


def _decide_summary(run: Path, config: Mapping, ledgers: list[str]) -> Published:
    from dpsinkhorn.report.privacy_summary import privacy_summary

    path = Path(privacy_summary_file(run))
    data = _read(path)
    expected = fileio.json_bytes(privacy_summary(config, run))
    if data != expected:
        raise ValueError(
            f"{path}: not the summary of the ledgers and the training record as they are now "
            f"(stale or edited); rewrite it: dpsinkhorn privacy-summary --results {run} "
            "--config ..."
        )
    proof = "recomputed from the ledgers and the training record: equal"
    rel, sha = path.relative_to(run).as_posix(), fileio.sha256_of_bytes(data)
    return Published(rel, "privacy_summary", data, sorted(ledgers), proof, path, sha)


def manifest(files: Sequence[Published], name: str | None) -> dict:
    """The report of a decision: every published file with its sha256, kind, ledgers and
    proof, and each ledger's guarantee."""
    guarantees = {f.path: json.loads(f.data).get("guarantee") for f in files if f.kind == "ledger"}
    return {
        "version": MANIFEST_VERSION,
        "run": name,
        "ledgers": guarantees,
        "files": [
            {
                "path": f.path,
                "sha256": fileio.sha256_of_bytes(f.data),
                "kind": f.kind,
                "ledgers": f.ledgers,
                "guarantees": [guarantees[x] for x in f.ledgers],
                "proof": f.proof,
            }
            for f in files
        ],
        "not_released": f"everything else in the run folder, {NONPRIVATE}/ first: it is "
        "computed from the private data without a ledger, or mixes such rows (tables, figures, "
        "reports)",
    }


def check_out(out: str | Path, run: str | Path | None = None) -> None:
    """Refuse a release folder that exists and is not an empty folder, a symbolic link
    (the release is renamed into place: a link would be replaced, or refuse the rename),
    one whose parent is not a folder, and one inside the run folder (a publish folder in a
    DP folder is a file no rule writes there: every later release would be refused)."""
    out = Path(out)
    if out.is_symlink():
        raise ValueError(f"{out}: is a symbolic link; give the folder itself (a new or empty one)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty folder")
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{out}: cannot be created ({parent} is not a folder)")
    if run is not None and Path(run).is_dir() and out.resolve().is_relative_to(Path(run).resolve()):
        raise ValueError(f"{out}: inside the run folder {run}; publish outside it")


def release(
    run: str | Path,
    out: str | Path,
    folders: Sequence[Folder],
    config: Mapping | None = None,
    accept_no_guarantee: bool = False,
    device: str = "cpu",
    flag: str = ACCEPT_FLAG,
) -> list[Path]:
    """Publish the run's release into ``out`` (new or empty), all at once; return its files.

    The bytes written are those :func:`decide` checked; a source that changed meanwhile
    refuses the release. A kill leaves ``out`` as it was (absent or empty) and at most a
    hidden ``.<out>.tmp-<pid>`` folder, removed by the next release."""
    run, out = Path(run), Path(out)
    check_out(out, run)
    files = decide(run, folders, config, accept_no_guarantee, device, flag)
    name = config.get("run_name") if config is not None else run.name
    report = manifest(files, name)
    if config is not None:
        _check_run_manifest(Path(release_manifest_file(run)), report, run)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir(parents=True)
    except OSError as err:
        raise ValueError(f"{out}: cannot write the release there ({err.strerror})") from err
    try:
        for f in files:
            fileio.write_bytes(tmp / f.path, f.data)
        fileio.write_json(tmp / MANIFEST, report)
        for f in files:
            if fileio.sha256_of(f.source) != f.source_sha256:
                raise ValueError(f"{f.source}: changed while it was released; refusing")
        try:
            if out.exists():
                out.rmdir()
            tmp.rename(out)
        except OSError as err:
            raise ValueError(f"{out}: cannot put the release there ({err.strerror})") from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return [out / MANIFEST, *(out / f.path for f in files)]


def _reported(report: Mapping) -> tuple:
    """What a decision report says, less what the redraw's device may change: each file's
    path, kind and ledgers, its sha256 (samples: redrawn, so not), and every guarantee."""
    files = sorted(
        (
            f.get("path"),
            f.get("kind"),
            tuple(f.get("ledgers") or ()),
            None if f.get("kind") == "samples" else f.get("sha256"),
        )
        for f in report.get("files") or []
        if isinstance(f, dict)
    )
    return files, report.get("ledgers")


def _check_run_manifest(path: Path, report: Mapping, run: Path) -> None:
    """Refuse a run whose ``release_manifest.json`` (when there is one) reports another
    decision than ``report``: edited, or stale (files changed since it was written)."""
    if not path.is_file():
        return
    try:
        said = json.loads(path.read_bytes())
    except ValueError:
        said = {}
    if not isinstance(said, dict) or _reported(said) != _reported(report):
        raise ValueError(
            f"{path}: does not report this release (other files, hashes or guarantees: "
            f"edited, or stale); write it again: dpsinkhorn release-manifest --config ... "
            f"--results {run}"
        )


def write_manifest(config: Mapping, results: str | Path, device: str = "cpu") -> Path:
    """Write the decision's report into ``<results>/release_manifest.json``; return its
    path (the workflow's last step: a run whose release would be refused fails here)."""
    files = decide(results, run_folders(config, results), config, True, device)
    path = Path(release_manifest_file(results))
    fileio.write_json(path, manifest(files, config.get("run_name")))
    return path


def _release_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    run = args.run or results_dir(config)
    folders = run_folders(config, run)
    files = release(run, args.out, folders, config, args.accept_no_guarantee, args.device)
    print(f"released {len(files)} files of {run} to {args.out}")
    from dpsinkhorn.report.privacy_summary import individual_lines, privacy_summary

    curator: list[str] = []
    for line in individual_lines(privacy_summary(config, run, curator)):
        print(line)
    for line in curator:  # the curator's terminal: not among the released files
        print(f"curator only: {line}")
    return 0


def _manifest_cli(args: argparse.Namespace) -> int:
    print(write_manifest(load_config(args.config), args.results, args.device))
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    r = subparsers.add_parser(
        "release", help="publish a finished run's DP releases, each file proven from its ledger"
    )
    r.add_argument("--run", help="results/<run> (default: the config's results folder)")
    r.add_argument(
        "--out", required=True, help="a new or empty folder outside the run folder, not a link"
    )
    r.add_argument(
        ACCEPT_FLAG,
        action="store_true",
        help='also release runs whose ledger says "guarantee": "none..." (public noise seed)',
    )
    m = subparsers.add_parser(
        "release-manifest", help="write <results>/release_manifest.json (the workflow's last step)"
    )
    m.add_argument("--results", required=True, help="results/<run>")
    for p, handler in [(r, _release_cli), (m, _manifest_cli)]:
        p.add_argument("--config", nargs="+", default=["config/config.yaml"], help="the run's")
        p.add_argument("--device", default="cpu", help="where samples are redrawn (default cpu)")
        p.set_defaults(handler=handler)
