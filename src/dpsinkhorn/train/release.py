"""What a training run publishes (:data:`OUTPUT_FILES`, :func:`publish`): generator.pt,
its privacy ledger privacy.json and train_log.csv. None holds anything computed on the
private data except through the sanitised gradient. docs/PRIVACY.md.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import torch

from dpsinkhorn.data.catalog import DATASETS, own_layout, resize_statement
from dpsinkhorn.fileio import sha256_of, sha256_of_bytes, torch_bytes, write_all, write_text
from dpsinkhorn.privacy.accounting import PrivacyAccountant, paper_convention_epsilon
from dpsinkhorn.privacy.noise import NO_GUARANTEE_PUBLIC_SEED
from dpsinkhorn.privacy.trainings import overflow_delta
from dpsinkhorn.train.trainer import Trainer

#: The files a run publishes in its output folder.
OUTPUT_FILES = ("generator.pt", "privacy.json", "train_log.csv")
#: train_log.csv (released): nothing computed on the private data.
LOG_COLUMNS = ["step", "epsilon", "steps_per_s", "elapsed_s"]
#: ``perturbation`` -> what a DP-Sinkhorn step's Gaussian mechanism clips and noises.
MECHANISMS = {
    "image": "the gradient w.r.t. generated images (rows 0:n clipped and noised; rows "
    "n:n+n' clipped only)",
    "parameter": "the generator's parameter gradient (all parameters as one vector, "
    "clipped to L2 norm clip and noised)",
}


def write_log(path: Path, rows: list[dict], columns: list[str] = LOG_COLUMNS) -> str:
    """Write ``rows`` as a CSV file of ``columns`` (train_log.csv unless told otherwise);
    returns the sha256 of the bytes written."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())
    return sha256_of(path)


def generator_payload(trainer: Trainer) -> bytes:
    """The bytes of generator.pt: deterministic (no file name inside)."""
    generator = {
        "state_dict": trainer.model.state_dict(),
        "model_config": trainer.model_config.to_dict(),
        "dataset": trainer.settings.dataset,
        "num_classes": trainer.num_classes,
        "image_shape": list(trainer.image_shape),
        "experiment": trainer.settings.name,
        "steps": trainer.step_count,
    }
    # Only where they say something: the declared class names (public: given by the
    # caller, not read from the data) and an unconditional generator's flag.
    if trainer.classes_declared:
        generator["class_names"] = list(trainer.class_names)
    if not trainer.conditional:
        generator["conditional"] = False
    return torch_bytes(generator)


def privacy_record(trainer: Trainer) -> dict:
    """The trainer's privacy ledger: privacy.json less ``content_sha256`` and ``threads``."""
    base = {
        "experiment": trainer.settings.name,
        "method": trainer.settings.method,
        "q": trainer.q,
        "batch_size": trainer.n,
        "n_prime": trainer.n_prime,
        "steps": trainer.step_count,
        "poisson_capacity": None if trainer.sampler is None else trainer.sampler.capacity,
        "reproducible": trainer.settings.reproducible,
    }
    definition = trainer.experiment.get("dataset_definition")
    if definition is not None:  # an own dataset: say what the generator was trained on
        base["data"] = {
            "dataset": trainer.settings.dataset,
            "layout": own_layout(definition["path"]),
            "image_size": definition["image_size"],
            "channels": definition["channels"],
            "preparation": resize_statement(definition),
            "test_split": "not covered: an evaluation against the private test split is "
            "computed from private data and is not part of the release",
        }
    elif trainer.settings.dataset not in DATASETS:  # arrays given to the Python API
        base["data"] = {
            "dataset": trainer.settings.dataset,
            "layout": "arrays given to api.train",
            "image_shape": list(trainer.image_shape),
            "test_split": "none given",
        }
    s = trainer.sanitizer
    if s is None:
        unset = dict.fromkeys(("epsilon", "epsilon_paper_convention", "guarantee"))
        return {**base, "private": False, **unset}
    epsilon, delta = trainer.epsilon(), trainer.accountant.delta
    if trainer.settings.method == "dpmerf":
        mechanism, noise_bits = merf_record(trainer), 64
    else:
        mechanism, noise_bits = sinkhorn_record(trainer, epsilon), 32
    delta_total = mechanism["delta_total"]
    return {
        **base,
        "private": True,
        "guarantee": NO_GUARANTEE_PUBLIC_SEED
        if trainer.settings.reproducible
        else guarantee_sentence(epsilon, delta_total, noise_bits),
        **mechanism,
        "sigma": s.noise_scale,
        "noise_std": s.noise_std,
        "sensitivity": s.sensitivity,
        "noise_multiplier": s.noise_multiplier,
        "delta": delta,
        "target_epsilon": trainer.settings.target_epsilon,
        "epsilon_convention": trainer.settings.epsilon_convention,
        "epsilon_convention_note": "convention under which target_epsilon solved sigma "
        "or steps; epsilon is always the sound accountant's",
        "epsilon": epsilon,
        "accountant": f"{trainer.accountant.kind} ({PrivacyAccountant.describe()})",
    }


def sinkhorn_record(trainer: Trainer, epsilon: float) -> dict:
    """The DP-Sinkhorn ledger's own keys: the mechanism per step, Poisson sampling at q and
    its overflow charge, and the paper's (invalid) convention for comparison."""
    s = trainer.sanitizer
    overflow = trainer.sampler.overflow_probability
    # (ε, δ + (1 + e^ε)·T·p)-DP: the coupling bound in PoissonSampler's docstring.
    delta_overflow = overflow_delta([(trainer.step_count, overflow)], epsilon)
    return {
        "perturbation": trainer.settings.perturbation,
        "mechanism": f"Gaussian mechanism on {MECHANISMS[trainer.settings.perturbation]}, Poisson "
        "sampling, add/remove-one adjacency",
        "clipping": s.clipping,
        "clip": s.clip,
        "poisson_overflow_probability_per_step": overflow,
        "delta_poisson_overflow": delta_overflow,
        "delta_total": trainer.accountant.delta + delta_overflow,
        "delta_total_note": "delta of the accountant plus (1 + e^epsilon) x steps x the "
        "per-step probability that the Poisson sample exceeded the buffer (then it is "
        "truncated); epsilon holds at delta_total",
        "epsilon_paper_convention": paper_convention_epsilon(
            trainer.q, s.noise_scale, trainer.step_count, trainer.n, trainer.accountant.delta
        ),
        "epsilon_paper_convention_note": "compute_rdp(q, sigma, steps*n) as in the paper; "
        "not a valid guarantee for this mechanism",
    }


def guarantee_sentence(epsilon: float, delta_total: float, noise_bits: int = 32) -> str:
    """privacy.json's ``guarantee`` of a secret-key DP release (``publish.proofs`` parses it)."""
    return (
        f"(epsilon, delta)-DP with epsilon = {epsilon:.6g}, delta = {delta_total:.6g} "
        "for generator.pt and everything computed from it, under add/remove-one "
        "adjacency, N public, a secret noise key, and the Gaussian noise sampled "
        f"exactly (float{noise_bits} noise is a known limitation)"
    )


def merf_record(trainer) -> dict:
    """The DP-MERF ledger's own keys (``train.merf.MerfTrainer``): one Gaussian mechanism
    (``privacy.merf``), so ``q`` = 1 and ``steps`` = 1 (releases; the generator's steps are
    ``generator_steps``), with no Poisson sampling and hence no overflow charge."""
    return {
        "steps": trainer.accountant.steps,
        "generator_steps": trainer.step_count,
        "poisson_capacity": None,
        "perturbation": None,
        "mechanism": "Gaussian mechanism on the sum of class-conditional random Fourier "
        "feature embeddings phi(x) (x) onehot(y) (DP-MERF), released once; each record's "
        "embedding has norm 1, so the sensitivity is 1 under add/remove-one adjacency; "
        "the generator is fitted to the release (post-processing)",
        "rff_features": trainer.settings.rff_features,
        "rff_bandwidth": trainer.settings.rff_bandwidth,
        "clipping": None,
        "clip": None,
        "poisson_overflow_probability_per_step": 0.0,
        "delta_poisson_overflow": 0.0,
        "delta_total": trainer.accountant.delta,
        "delta_total_note": "no Poisson sampling: delta_total is the accountant's delta",
        "epsilon_paper_convention": None,
        "epsilon_paper_convention_note": "none: one release has no per-step convention "
        "(DP-MERF's code states replace-one DP, noise std 2 noise_factor / N on the mean)",
    }


def publish(trainer: Trainer, out_dir: Path, log_rows: list[dict]) -> dict:
    """Write the run's release into ``out_dir``: train_log.csv, then privacy.json and
    generator.pt together (:func:`commit_release`); returns privacy.json's content."""
    payload = generator_payload(trainer)
    log_sha256 = write_log(out_dir / "train_log.csv", log_rows)
    record = {
        **privacy_record(trainer),
        # identifies the released generator; bit-identical reruns need equal threads
        "content_sha256": sha256_of_bytes(payload),
        # the train_log.csv written with it: a release refuses an edited log
        "train_log_sha256": log_sha256,
        "threads": torch.get_num_threads(),
    }
    commit_release(out_dir, payload, (json.dumps(record, indent=2) + "\n").encode())
    return record


def commit_release(out_dir: Path, generator: bytes, ledger: bytes) -> None:
    """Write generator.pt and its ledger privacy.json so that the generator never exists
    alone: both in full first (``fileio.write_all``: a full disk changes nothing), then an
    older generator removed, the ledger moved into place, the generator last."""
    path = out_dir / "generator.pt"
    write_all([(out_dir / "privacy.json", ledger), (path, generator)], remove_first=[path])
