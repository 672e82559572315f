rule table1:
    input:
        unpack(lambda w: targets.table_files(config, "table1", RESULTS)),
    output:
        md=report(f"{TABLES}/table1.md", caption=CAPTION, category="Tables"),
        csv=f"{TABLES}/table1.csv",
        tex=f"{TABLES}/table1.tex",
        figures=[
            report(f"{FIGURES}/samples_{d}.png", caption=CAPTION, category="Figures")
            for d in figure_datasets(config)
        ],
    params:
        config_files=CONFIG_FILES,
        caption=report_caption("table1"),
        out_dir=lambda w, output: Path(output.md).parent.parent,
    log:
        f"{LOGS}/table1.log",
    benchmark:
        f"{BENCH}/table1.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report table1 --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"


# The CelebA tables, written by one rule each from the same definition: Table 3 (DP-Sinkhorn,
# non-private, real data; figure fig3) and Table 6 (BigGAN vs DCGAN generator; fig6).
for celeba_table in targets.CELEBA_TABLES:

    rule:
        name:
            celeba_table
        input:
            unpack(celeba_table_inputs(celeba_table)),
        output:
            **in_report(targets.output_files(config, celeba_table, RESULTS)),
        params:
            # The shell command is formatted when the job runs, after the loop has ended:
            # the loop variable reaches it through params (fixed now), never directly.
            table=celeba_table,
            config_files=CONFIG_FILES,
            caption=report_caption(celeba_table),
            out_dir=lambda w, output: Path(output.md).parent.parent,
        log:
            f"{LOGS}/{celeba_table}.log",
        benchmark:
            f"{BENCH}/{celeba_table}.tsv"
        threads: 1
        resources:
            mem_mb=4000,
            runtime=30,
        conda:
            CONDA_ENV
        shell:
            "dpsinkhorn report {params.table}"
            " --config {params.config_files} --out-dir {params.out_dir} > {log} 2>&1"


# Accounting across releases: per dataset, the DP releases, their composed epsilon and the
# configurations tried (dpsinkhorn.report.privacy_summary). Reads the ledgers only.
rule privacy_summary:
    input:
        targets.privacy_files(config, RESULTS, private_experiments(config)),
    output:
        targets.privacy_summary_file(RESULTS),
    params:
        config_files=CONFIG_FILES,
        results=lambda w, output: Path(output[0]).parent,
    log:
        f"{LOGS}/privacy_summary.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn privacy-summary --config {params.config_files} --results {params.results}"
        " --out {output} > {log} 2>&1"


# The release, defined by the code: every publishable file (the DP experiments' folders and
# the summary) with its hash and ledger; `dpsinkhorn release` copies exactly these.
rule release_manifest:
    input:
        targets.release_inputs(config, RESULTS),
    output:
        targets.release_manifest_file(RESULTS),
    params:
        config_files=CONFIG_FILES,
        results=lambda w, output: Path(output[0]).parent,
    log:
        f"{LOGS}/release_manifest.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn release-manifest --config {params.config_files} --results {params.results}"
        " > {log} 2>&1"
