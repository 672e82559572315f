rule table1:
    input:
        unpack(table1_inputs),
    output:
        md=report(f"{RESULTS}/tables/table1.md", caption=CAPTION, category="Tables"),
        csv=f"{RESULTS}/tables/table1.csv",
        tex=f"{RESULTS}/tables/table1.tex",
        figures=[
            report(f"{RESULTS}/figures/samples_{d}.png", caption=CAPTION, category="Figures")
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


# Table 3 (CelebA: DP-Sinkhorn, non-private, real data) and fig3.
rule table3:
    input:
        unpack(lambda w: table_files(config, "table3", RESULTS)),
    output:
        **in_report(table_outputs(config, "table3", RESULTS)),
    params:
        config_files=CONFIG_FILES,
        caption=report_caption("table3"),
        out_dir=lambda w, output: Path(output.md).parent.parent,
    log:
        f"{LOGS}/table3.log",
    benchmark:
        f"{BENCH}/table3.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report table3 --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"


# Table 6 (CelebA: BigGAN vs DCGAN generator) and fig6.
rule table6:
    input:
        unpack(lambda w: table_files(config, "table6", RESULTS)),
    output:
        **in_report(table_outputs(config, "table6", RESULTS)),
    params:
        config_files=CONFIG_FILES,
        caption=report_caption("table6"),
        out_dir=lambda w, output: Path(output.md).parent.parent,
    log:
        f"{LOGS}/table6.log",
    benchmark:
        f"{BENCH}/table6.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report table6 --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"
