# Resumes from its own checkpoint, so a retry continues where the failed attempt stopped.
# Only a scheduler's stop is worth a retry. On SIGINT (Ctrl-C) training checkpoints and
# exits 130; on bad input (a damaged checkpoint, a locked output folder, a full disk) it
# exits 2 with one line. Either leaves a note in the output folder: a retry (--attempt
# > 1, Snakemake's attempt number) finds it and ends at once with the same code, so the
# same failure never runs again (Ctrl-C also stops Snakemake itself: common.smk).
# On SIGTERM/SIGUSR1 it checkpoints and exits 75: `exec` makes the shell that Snakemake
# starts *be* the training, so a signal sent to the whole job (SLURM's time-limit
# warning, a preemption) reaches it without first killing that shell.
# The outputs are the release only. Checkpoints live in {exp}/private_workspace/ (never
# an output, never to be shared; deleted when training completes, see docs/PRIVACY.md).
# A DP release trains into {RESULTS}/{exp}/, anything else into {RESULTS}/nonprivate/{exp}/.
# The outputs are update(): Snakemake keeps a finished run's files while the job runs and
# puts them back if it fails, so a refused retrain of a finished DP experiment (exit 2,
# docs/PRIVACY.md) leaves its generator as it was.
TRAINING_FILES = targets.TRAINING_FILES


rule train:
    input:
        train=dataset_file("train"),
    output:
        generator=update(f"{RESULTS}/{{home}}{{exp}}/generator.pt"),
        privacy=update(f"{RESULTS}/{{home}}{{exp}}/privacy.json"),
        log_csv=update(f"{RESULTS}/{{home}}{{exp}}/train_log.csv"),  # = TRAINING_FILES
    params:
        config_files=CONFIG_FILES,
        out=lambda w, output: Path(output.generator).parent,
        spec=lambda w: experiment_spec(config, w.exp),  # changed settings -> retrain
        device=TRAIN_DEVICE,
    wildcard_constraints:
        exp=TRAINED_ALONE,
    log:
        f"{LOGS}/{{home}}train_{{exp}}.log",
    benchmark:
        f"{BENCH}/{{home}}train_{{exp}}.tsv"
    threads: 4
    # Retries come from the main Snakemake process only (a new job, once the old one is
    # gone), never from the Snakemake that runs the step inside a cluster job.
    retries: 0 if workflow.remote_exec else 3
    resources:
        gpu=GPUS,
        mem_mb=16000,
        runtime=lambda w: REQUESTS.minutes(w.exp),
        attempt=lambda w, attempt: attempt,  # Snakemake's attempt number: --attempt
    conda:
        CONDA_ENV
    shell:
        "exec dpsinkhorn train --config {params.config_files} --experiment {wildcards.exp}"
        " --out {params.out} {params.device} --attempt {resources.attempt} > {log} 2>&1"


# sweep_runs > 1: each group of compatible experiments trains in one process on one device
# (dpsinkhorn.train.sweep), writing the same files, checkpoints and ledgers as `train` would.
for members in SWEEPS:

    rule:
        name:
            f"train_sweep_{members[0]}"
        input:
            train=prepared_file(dataset_of(config, members[0]), "train"),
        output:
            [
                update(f"{experiment_dir(config, RESULTS, e)}/{f}")
                for e in members
                for f in TRAINING_FILES
            ],
        params:
            config_files=CONFIG_FILES,
            experiments=" ".join(members),
            specs=[experiment_spec(config, e) for e in members],  # changed settings -> retrain
            device=TRAIN_DEVICE,
        log:
            f"{LOGS}/train_sweep_{members[0]}.log",
        benchmark:
            f"{BENCH}/train_sweep_{members[0]}.tsv"
        threads: 4
        # Its name is per sweep, so profiles/slurm cannot name it: the rule itself carries
        # the SIGTERM before the time limit and the retries its chain of jobs needs (also
        # on one machine: Snakemake cannot tell the executor while it reads the rules).
        retries: 0 if workflow.remote_exec else REQUESTS(members).retries
        resources:
            gpu=GPUS,
            mem_mb=16000,
            runtime=lambda w, members=members: REQUESTS.minutes(members),  # when jobs are made
            slurm_extra=SLURM_SIGNAL,
            attempt=lambda w, attempt: attempt,
        conda:
            CONDA_ENV
        shell:
            "exec dpsinkhorn train-sweep --config {params.config_files}"
            " --experiments {params.experiments} --out-root {RESULTS} {params.device}"
            " --attempt {resources.attempt} > {log} 2>&1"
