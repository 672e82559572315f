"""The outputs of the workflow: every table, figure and report, their kind and title.

THE list of outputs. Every other module (the CLI's ``targets`` and ``plan``, the rules,
the report builders and captions) takes the names and titles from here.

Kinds:
- ``table1``, ``table3``, ``table6``: the paper's main tables, from configured experiments;
- study tables and figures (:data:`TABLE_STUDIES`, :data:`FIGURE_STUDIES`): from the cells
  of a ``studies:`` entry (:mod:`dpsinkhorn.config.studies`);
- sample figures (:data:`SAMPLE_FIGURES`): grids of the Table 1 generators' samples;
- ``reproduction``: the paper's numbers against this run.
"""

from __future__ import annotations

from dpsinkhorn.config.studies import FIGURE_STUDIES, STUDIES, TABLE_STUDIES

#: The main tables built from configured experiments (not from studies).
MAIN_TABLES = ("table1", "table3", "table6")
#: CelebA tables (paper Tables 3 and 6), built by :mod:`dpsinkhorn.report`.
CELEBA_TABLES = ("table3", "table6")
#: Sample-grid figures -> samples per class (paper Figures 2 and 7).
SAMPLE_FIGURES = {"fig2": 10, "fig7": 20}
#: Every output name, in the paper's order.
NAMES = ("table1", "table2", "table3", "table4", "table5", "table6", "fig2", "fig4a", "fig4b",
         "fig4c", "fig5", "fig7", "eps10", "reproduction")  # fmt: skip

TITLES = {
    **STUDIES,
    "table1": "Table 1: DP image generation on MNIST and Fashion-MNIST",
    "table3": "Table 3: DP image generation on CelebA 32×32 (gender-conditioned)",
    "table6": "Table 6: generator architecture on CelebA 32×32 (DP-Sinkhorn, L2 cost)",
    "fig2": "Figure 2: DP-Sinkhorn samples, 10 per class",
    "fig7": "Figure 7: more DP-Sinkhorn samples, 20 per class (appendix)",
    "reproduction": "Reproduction: the paper's numbers against this run",
}

assert set(TITLES) == set(NAMES), "every output has a title"
assert set(NAMES) == {*MAIN_TABLES, *TABLE_STUDIES, *FIGURE_STUDIES, *SAMPLE_FIGURES,
                      "reproduction"}  # fmt: skip
