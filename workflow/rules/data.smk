rule data:
    input:
        lambda w: data_inputs(config, PREPARED[w.folder]),  # synthetic CelebA, own data's path
    output:
        train=f"{DATA}/{{folder}}/train.npz",  # = prepared_file (common.smk)
        test=f"{DATA}/{{folder}}/test.npz",
    params:
        root=lambda w, output: Path(output.train).parent.parent,
        dataset=lambda w: PREPARED[w.folder],
        # What decides the prepared bytes (dpsinkhorn.config.workflow.data_identity): the
        # one param that reruns this rule. The mirror's path is not, where every source
        # gives the same bytes: another spelling or copy of it re-prepares nothing.
        identity=lambda w: data_identity(config, PREPARED[w.folder]),
        # --mirror for a built-in dataset; --config and its entry's hash for an own one
        # (takes `output`: Snakemake then never reruns the rule because it changed)
        source=lambda w, output: data_source_args(config, PREPARED[w.folder], CONFIG_FILES),
    log:
        f"{LOGS}/data_{{folder}}.log",
    benchmark:
        f"{BENCH}/data_{{folder}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn data --dataset {params.dataset} --root {params.root:q} {params.source}"
        " > {log} 2>&1"


# Smoke/CI only (config key celeba_fixture): a small synthetic CelebA in torchvision's
# layout, which the data rule then reads as its mirror for celeba.
rule celeba_fixture:
    output:
        directory(f"{DATA}/celeba_source"),
    params:
        num=lambda w: config["celeba_fixture"]["num"],
        seed=lambda w: config["celeba_fixture"]["seed"],
    log:
        f"{LOGS}/celeba_fixture.log",
    benchmark:
        f"{BENCH}/celeba_fixture.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn celeba-fixture --out {output:q} --num {params.num} --seed {params.seed}"
        " > {log} 2>&1"
