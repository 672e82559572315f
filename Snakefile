# DP-Sinkhorn (Cao et al., NeurIPS 2021): Table 1 from raw data to tables and figures.
#
#   snakemake --profile profiles/default                                   # the paper
#   snakemake --profile profiles/default --configfile config/quick.yaml    # 2-core CPU
#   ... --config data_mirror=../shared/data fid_weights=PATH device=cuda   # the only overrides
#   snakemake --profile profiles/slurm ...                  # on a SLURM cluster (docs/CLUSTER.md)
#
# Each step is a `dpsinkhorn <command>` call; settings live in the config files, which
# the steps read themselves. Outputs: results/<run_name>/ (see docs/CONTRACTS.md).

from snakemake.utils import min_version

min_version("8.0")


# A --configfile replaces this default instead of being merged over it: a merge would
# add the paper's experiments to every other run. (Found next to this Snakefile, also
# when run with --directory elsewhere.)
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/studies.smk"


# Every job succeeded, so no writer of this run is left: the temporary files of writers
# killed mid-write (SIGKILL) in an earlier, interrupted run go (docs/PRIVACY.md, "After an
# interruption"), from this run's own folders only: another run sharing data_dir may be
# writing there.
onsuccess:
    remove_killed_writers_temps(
        *killed_writers_folders(
            config, RESULTS, lambda out: finished_copy_dir(Path(DATA) / RECORD_DIR, out)
        )
    )


# snakemake --report results/<run>/report.html: every table and figure with its caption.
report: "workflow/report/workflow.rst"


# Quick steps that need no GPU run where Snakemake runs, also with --executor slurm
# (data may need the internet, which compute nodes often lack).
localrules:
    all,
    data,
    celeba_fixture,
    table1,
    table3,
    table6,
    study_table,
    study_figure,
    reproduction,
    privacy_summary,
    release_manifest,


rule all:
    input:
        rules.table1.output,
        outside_table1_outputs(),
        targets.all_outputs(config, RESULTS),  # Tables 2-6, Figures 2/4/5/7, reproduction.md
        targets.release_manifest_file(RESULTS),  # what `dpsinkhorn release` publishes
    default_target: True
