# Resumes from its own checkpoint, so a retry continues where the failed attempt stopped.
# On SIGTERM/SIGUSR1 it checkpoints and exits 75: `exec` makes the shell that Snakemake
# starts *be* the training, so a signal sent to the whole job (SLURM's time-limit
# warning, a preemption) reaches it without first killing that shell.
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
    # Retries come from the main Snakemake process only (a new job, once the old one is
    # gone), never from the Snakemake that runs the step inside a cluster job.
    retries: 0 if workflow.remote_exec else 3
    resources:
        gpu=GPUS,
        mem_mb=16000,
        runtime=lambda w: train_runtime_minutes(config, w.exp),
    conda:
        CONDA_ENV
    shell:
        "exec dpsinkhorn train --config {params.config_files} --experiment {wildcards.exp}"
        " --out {params.out} {params.device} > {log} 2>&1"
