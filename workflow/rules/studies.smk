# The paper's outputs beyond Table 1: Tables 2/4/5, Figures 2/4a/4b/4c/5/7 and
# reproduction.md. Their cells are ordinary experiments (dpsinkhorn.config.studies), trained and
# evaluated by the rules of train.smk and evaluate.smk; file lists come from dpsinkhorn.config.targets.


rule study_table:
    input:
        unpack(lambda w: targets.inputs(config, w.name, RESULTS)),
    output:
        md=report(f"{TABLES}/{{name}}.md", caption=CAPTION, category="Tables"),
        csv=f"{TABLES}/{{name}}.csv",
        tex=f"{TABLES}/{{name}}.tex",
    wildcard_constraints:
        name=targets.study_regex(config, "table"),
    params:
        config_files=CONFIG_FILES,
        out_dir=lambda w, output: Path(output.md).parent.parent,
        caption=report_caption(),
    log:
        f"{LOGS}/{{name}}.log",
    benchmark:
        f"{BENCH}/{{name}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report {wildcards.name} --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"


rule study_figure:
    input:
        unpack(lambda w: targets.inputs(config, w.name, RESULTS)),
    output:
        png=report(f"{FIGURES}/{{name}}.png", caption=CAPTION, category="Figures"),
        pdf=f"{FIGURES}/{{name}}.pdf",
        csv=f"{FIGURES}/{{name}}.csv",
    wildcard_constraints:
        name=f"{targets.study_regex(config, 'figure')}|{targets.study_regex(config, 'samples')}",
    params:
        config_files=CONFIG_FILES,
        out_dir=lambda w, output: Path(output.png).parent.parent,
        caption=report_caption(),
    log:
        f"{LOGS}/{{name}}.log",
    benchmark:
        f"{BENCH}/{{name}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report {wildcards.name} --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"


# Figure 4c: bias and variance of the generator-gradient estimator of one trained generator
# (non-private analysis of the training data: it lives under nonprivate/, never in a release).
rule grad_study:
    input:
        generator=experiment_file("generator.pt"),
        train=dataset_file("train"),
    output:
        f"{RESULTS}/nonprivate/{{exp}}/gradstudy.json",  # = targets.gradstudy_file
    params:
        config_files=CONFIG_FILES,
        p_values=" ".join(str(p) for p in gradient_settings(config)["p_values"]),
        batches=gradient_settings(config)["batches"],
        device=DEVICE,
    wildcard_constraints:
        exp=TRAINED,
    log:
        f"{LOGS}/grad_study_{{exp}}.log",
    benchmark:
        f"{BENCH}/grad_study_{{exp}}.tsv"
    threads: 2
    resources:
        gpu=GPUS,
        mem_mb=8000,
        runtime=capped_minutes(config, 120),
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn grad-study --config {params.config_files} --experiment {wildcards.exp}"
        " --generator {input.generator:q} --data {input.train:q} --p {params.p_values}"
        " --batches {params.batches} --seed 0 --out {output} {params.device} > {log} 2>&1"


rule reproduction:
    input:
        unpack(lambda w: targets.inputs(config, "reproduction", RESULTS)),
    output:
        report(f"{RESULTS}/reproduction.md", caption=CAPTION, category="Reproduction"),
    params:
        config_files=CONFIG_FILES,
        out_dir=lambda w, output: Path(output[0]).parent,
        caption=report_caption("reproduction"),
    log:
        f"{LOGS}/reproduction.log",
    benchmark:
        f"{BENCH}/reproduction.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn report reproduction --config {params.config_files} --out-dir {params.out_dir}"
        " > {log} 2>&1"
