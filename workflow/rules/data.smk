rule data:
    output:
        train=f"{DATA}/{{dataset}}/train.npz",
        test=f"{DATA}/{{dataset}}/test.npz",
    params:
        root=lambda w, output: Path(output.train).parent.parent,
        mirror=flag("--mirror", config["data_mirror"]),
    log:
        f"{LOGS}/data_{{dataset}}.log",
    benchmark:
        f"{BENCH}/data_{{dataset}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn data --dataset {wildcards.dataset} --root {params.root} {params.mirror}"
        " > {log} 2>&1"
