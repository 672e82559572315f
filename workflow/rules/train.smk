# Resumes from its own checkpoint, so a retry continues where the failed attempt stopped.
rule train:
    input:
        train=dataset_file("train"),
    output:
        generator=f"{RESULTS}/{{exp}}/generator.pt",
        privacy=f"{RESULTS}/{{exp}}/privacy.json",
        log_csv=f"{RESULTS}/{{exp}}/train_log.csv",
    params:
        config_files=CONFIG_FILES,
        out=lambda w, output: Path(output.generator).parent,
        spec=lambda w: experiment_spec(config, w.exp),  # changed settings -> retrain
        device=DEVICE,
    wildcard_constraints:
        exp=TRAINED,
    log:
        f"{LOGS}/train_{{exp}}.log",
    benchmark:
        f"{BENCH}/train_{{exp}}.tsv"
    threads: 4
    retries: 3
    resources:
        mem_mb=16000,
        runtime=lambda w: train_runtime_minutes(config, w.exp),
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn train --config {params.config_files} --experiment {wildcards.exp}"
        " --out {params.out} {params.device} > {log} 2>&1"
