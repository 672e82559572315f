"""``dpsinkhorn privacy``: (ε, δ) of DP-Sinkhorn training, or the steps / σ for a target ε."""

from __future__ import annotations

import argparse
import json

from dpsinkhorn.privacy.accounting import ACCOUNTANTS
from dpsinkhorn.privacy.budget import privacy_report
from dpsinkhorn.privacy.mechanism import CLIPPING_MODES


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "privacy",
        help="(ε, δ) of DP-Sinkhorn training, or the steps / σ for a target ε",
        description="Prints one JSON object. Give --sigma with --steps (ε), --sigma with "
        "--epsilon (most steps), or --steps with --epsilon (solve σ).",
    )
    p.add_argument("--q", type=float, required=True, help="Poisson sampling rate B/N")
    p.add_argument("--sigma", type=float, help="noise scale σ (noise std 2Δσ)")
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="n = B generated cross rows")
    p.add_argument("--steps", type=int)
    p.add_argument("--epsilon", type=float, help="target ε")
    p.add_argument("--convention", choices=["sound", "paper"], default="sound")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp")
    p.add_argument("--clipping", choices=CLIPPING_MODES, default="batch")
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    if args.steps is None and args.epsilon is None:
        raise ValueError("give --steps, --epsilon, or both")
    names = "q delta batch_size sigma steps epsilon convention accountant clipping".split()
    print(json.dumps(privacy_report(**{name: getattr(args, name) for name in names})))
    return 0
