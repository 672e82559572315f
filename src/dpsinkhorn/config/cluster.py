"""What a cluster job asks for: wall time from measured step rates (else
``max_job_minutes``), retries of a checkpointing job chain, evaluation time
(docs/CLUSTER.md). Torch-free: the Snakefile imports it while it parses."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpsinkhorn.config.experiments import (
    PathLike,
    experiment,
    experiment_classifiers,
    needs_training,
)

#: Minutes between SLURM's SIGTERM and the time limit (``--signal=TERM@300``).
SIGNAL_LEAD_MINUTES = 5
#: The sbatch option that sends it (slurm_extra of every training and sweep job).
SLURM_SIGNAL = f"'--signal=TERM@{SIGNAL_LEAD_MINUTES * 60}'"
#: Resubmissions of a job that stopped for any cause other than its time limit
#: (a preemption that cancels, a node failure): the retries training always had.
OTHER_RETRIES = 3
#: Resubmissions of a training job of unknown chain length (no measured rate, or steps
#: solved at run time); profiles/slurm gives ``train`` the same (``preemptible-retries``).
UNKNOWN_CHAIN_RETRIES = 20
#: Nominal minutes of each part of an evaluation job per seed (before the cap).
EVAL_MINUTES_PER_SEED = {"sample": 60, "fid": 120, "classify": 240}


@dataclass(frozen=True)
class TrainRequest:
    """What one training job (``train`` or ``train_sweep_*``) asks the scheduler for."""

    minutes: int  #: the request (SLURM --time), at most max_job_minutes
    estimate_minutes: float | None  #: steps / rate / 60 × safety + start-up; None: no rate
    chain_jobs: int | None  #: jobs the training needs at this request; None: unknown
    steps: int | None  #: training steps of the job's longest run; None: solved at run time
    steps_per_s: float | None  #: the job's measured rate (sweep steps/s for a sweep)
    note: str  #: where the rate came from, or why the job asks for the cap

    @property
    def retries(self) -> int:
        """Resubmissions the job needs: its chain's, plus :data:`OTHER_RETRIES`."""
        unknown = self.chain_jobs is None
        return UNKNOWN_CHAIN_RETRIES if unknown else self.chain_jobs - 1 + OTHER_RETRIES


def rates_file(config: Mapping, bases: Sequence[PathLike] = ()) -> Path:
    """The step-rate file of ``cluster.step_rates``: a relative path is looked up in the
    working directory, then in each of ``bases`` (the workflow's folder); the first that
    exists, else the path as given (the error names it)."""
    path = Path(config["cluster"]["step_rates"])
    found = [p for p in [path, *(Path(base) / path for base in bases)] if p.exists()]
    return found[0] if found else path


def load_rates(path: PathLike) -> list[dict]:
    """Measured step rates (JSON ``{"rates": [{dataset, batch_size, runs, steps_per_s,
    source}, ...]}``); a one-line ``ValueError`` names the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: step-rate file not found (cluster.step_rates)") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON step-rate file ({err})") from None
    rates = data.get("rates") if isinstance(data, dict) else None
    if not isinstance(rates, list) or not rates:
        raise ValueError(f"{path}: needs a non-empty list 'rates'")
    for k, rate in enumerate(rates):
        if not isinstance(rate, dict):
            raise ValueError(f"{path}: rates[{k}] must be a mapping")
        for key in ("dataset", "batch_size", "runs", "steps_per_s", "source"):
            if key not in rate:
                raise ValueError(f"{path}: rates[{k}] has no {key!r}")
        value = rate["steps_per_s"]
        if type(value) not in (int, float) or not 0 < value < math.inf:  # JSON: no bool
            raise ValueError(f"{path}: rates[{k}].steps_per_s must be a finite number > 0")
    return rates


#: [H, W, C] of the built-in datasets' images (a step's cost depends on shape, not name).
BUILTIN_IMAGE_SHAPES = {"mnist": (28, 28, 1), "fmnist": (28, 28, 1), "celeba": (32, 32, 3)}
#: The generator of a rate entry that names none (``generator``, ``channels``): the paper's DCGAN.
RATE_GENERATOR = ("dcgan", (256, 128, 64))


def step_shape_key(entry: Mapping) -> tuple | None:
    """(image [H, W, C], batch size, generator, widths) of a rate entry or an experiment
    spec (no generator: :data:`RATE_GENERATOR`); None when the image shape is unknown."""
    if "image_shape" in entry:
        shape = tuple(int(v) for v in entry["image_shape"])
    elif entry.get("dataset_definition"):
        definition = entry["dataset_definition"]
        size, channels = int(definition["image_size"]), int(definition["channels"])
        shape = (size, size, channels)
    else:
        shape = BUILTIN_IMAGE_SHAPES.get(entry["dataset"])
    generator = entry.get("generator", RATE_GENERATOR[0])
    widths = tuple(entry.get("channels") or RATE_GENERATOR[1])
    return None if shape is None else (shape, int(entry["batch_size"]), generator, widths)


def matching_rate(rates: Sequence[dict], spec: Mapping, runs: int) -> tuple[float | None, str]:
    """(steps/s of a job of ``runs`` runs of this shape, its source) or (None, ""). A sweep
    of k runs takes the smallest measured sweep of K >= k runs, else the single rate / k."""
    key = step_shape_key(spec)
    same = [r for r in rates if key is not None and step_shape_key(r) == key]
    found = sorted((r for r in same if int(r["runs"]) >= runs), key=lambda r: int(r["runs"]))
    if found and int(found[0]["runs"]) == runs:
        return found[0]["steps_per_s"], f"measured: {found[0]['source']}"
    if found and runs > 1:
        return found[0]["steps_per_s"], f"{found[0]['runs']}-run rate: {found[0]['source']}"
    single = [r for r in same if int(r["runs"]) == 1]
    if single and runs > 1:
        rate = single[0]["steps_per_s"] / runs
        return rate, f"single-run rate / {runs}: {single[0]['source']}"
    return None, ""


def train_request(config: Mapping, members: Sequence[str], rates: Sequence[dict]) -> TrainRequest:
    """The request of the job that trains ``members`` (one experiment, or a sweep's runs)."""
    cluster = config["cluster"]
    cap = int(cluster["max_job_minutes"])
    specs = [experiment(config, e) for e in members]
    spec = specs[0]
    shape = f"{spec['dataset']} B {spec['batch_size']}, {len(members)} run(s)"
    if any(s["steps"] is None for s in specs):
        note = "steps are solved from target_epsilon when training starts"
        return TrainRequest(cap, None, None, None, None, f"{note}: asks max_job_minutes")
    steps = max(int(s["steps"]) for s in specs)
    rate, source = matching_rate(rates, spec, len(members))
    if rate is None:
        note = f"no measured step rate for {shape}: asks max_job_minutes"
        return TrainRequest(cap, None, None, steps, None, note)
    train_minutes = steps / rate / 60 * float(cluster["safety_factor"])
    estimate = train_minutes + float(cluster["startup_minutes"])
    if estimate <= cap:
        chain = 1
    else:  # each job of the chain trains for its limit less start-up and the signal lead
        usable = cap - cluster["startup_minutes"] - SIGNAL_LEAD_MINUTES  # > 0: cluster_errors
        chain = math.ceil(train_minutes / usable)
    # At least the SIGTERM lead plus a minute: a shorter limit would signal the job (to
    # checkpoint and stop) as it starts, and the chain would never advance.
    minutes = max(math.ceil(estimate), SIGNAL_LEAD_MINUTES + 1)
    return TrainRequest(min(minutes, cap), estimate, chain, steps, rate, source)


def capped_minutes(config: Mapping, minutes: int) -> int:
    """A fixed ``runtime`` (minutes), at most ``max_job_minutes``."""
    return min(minutes, int(config["cluster"]["max_job_minutes"]))


def cluster_errors(config: Mapping) -> list[tuple[list, str]]:
    """(key path, message) when ``max_job_minutes`` leaves a job no time to train."""
    cluster = config["cluster"]
    floor = cluster["startup_minutes"] + SIGNAL_LEAD_MINUTES
    if cluster["max_job_minutes"] <= floor:
        message = (
            f"bad value {cluster['max_job_minutes']!r}: must exceed the SIGTERM lead "
            f"({SIGNAL_LEAD_MINUTES} min) + cluster.startup_minutes "
            f"({cluster['startup_minutes']} min) = {floor} min, or a job never trains"
        )
        return [(["cluster", "max_job_minutes"], message)]
    return []


class Requests:
    """Training requests of one config, the rate file read once. ``warn()``: whether to say
    on stderr (once per reason) that jobs ask for the cap without an estimate."""

    def __init__(
        self,
        config: Mapping,
        bases: Sequence[PathLike] = (),
        warn: Callable[[], bool] = lambda: False,
    ):
        self.config = config
        self.path = rates_file(config, bases)
        self.rates = load_rates(self.path)
        self.warn = warn
        self._cache: dict[tuple[str, ...], TrainRequest] = {}
        self._warned: set[str] = set()

    def __call__(self, members: Sequence[str] | str) -> TrainRequest:
        """The request of the job that trains ``members`` (a name or a sweep's names)."""
        key = (members,) if isinstance(members, str) else tuple(members)
        if key not in self._cache:
            self._cache[key] = train_request(self.config, key, self.rates)
        return self._cache[key]

    def minutes(self, members: Sequence[str] | str) -> int:
        """The job's ``runtime`` resource (minutes); says so when it is the cap."""
        request = self(members)
        if request.estimate_minutes is None and request.note not in self._warned and self.warn():
            self._warned.add(request.note)
            names = members if isinstance(members, str) else " ".join(members)
            print(
                f"cluster: train {names}: {request.note} = {request.minutes} min, a chain "
                f"of unknown length (rates: {self.path}; this line once per reason, "
                "dpsinkhorn plan --rates lists every job)",
                file=sys.stderr,
            )
        return request.minutes


def eval_runtime_minutes(config: Mapping, name: str) -> int:
    """``runtime`` of experiment ``name``'s evaluation job (``evaluate_<name>``): nominal
    minutes of sampling (trained experiments only), FID and each classifier, every seed
    (:data:`EVAL_MINUTES_PER_SEED`), capped at ``cluster.max_job_minutes``."""
    per_seed = EVAL_MINUTES_PER_SEED
    sample = per_seed["sample"] if needs_training(config, name) else 0
    models = len(experiment_classifiers(config, name))
    nominal = sample + per_seed["fid"] + models * per_seed["classify"]
    return capped_minutes(config, len(config["seeds"]) * nominal)
