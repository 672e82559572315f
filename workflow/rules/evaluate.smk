# On a cluster all evaluation of one experiment (its sampling, FID and classifiers, every
# seed) is one job: the group EVAL_GROUP, one per experiment. Each output is still its own
# rule, so one cell can be rerun by its file. The runtimes (dpsinkhorn.config.cluster) are
# scaled so that the group asks for at most cluster.max_job_minutes; profiles/slurm gives
# a group one GPU (its steps take turns) and joins real-data groups' FID and classifiers.
EVAL_GROUP = "eval_{exp}"


rule sample:
    input:
        generator=f"{RESULTS}/{{home}}{{exp}}/generator.pt",
    output:
        f"{RESULTS}/{{home}}{{exp}}/samples_seed{{seed}}.npz",
    params:
        num=EVAL["num_samples"],
        device=DEVICE,
    wildcard_constraints:
        exp=TRAINED,
    log:
        f"{LOGS}/{{home}}sample_{{exp}}_seed{{seed}}.log",
    benchmark:
        f"{BENCH}/{{home}}sample_{{exp}}_seed{{seed}}.tsv"
    priority: 20
    threads: 2
    resources:
        gpu=GPUS,
        mem_mb=8000,
        runtime=lambda w: eval_runtime_minutes(config, "sample", w.exp),
    group:
        EVAL_GROUP
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn sample --generator {input.generator} --num {params.num}"
        " --seed {wildcards.seed} --out {output} {params.device} > {log} 2>&1"


# Real-data rows: the "samples" are a draw from the real training set.
rule sample_real:
    input:
        data=dataset_file("train"),
    output:
        f"{RESULTS}/{{home}}{{exp}}/samples_seed{{seed}}.npz",
    params:
        num=EVAL["num_samples"],
    wildcard_constraints:
        exp=REAL,
    log:
        f"{LOGS}/{{home}}sample_{{exp}}_seed{{seed}}.log",
    benchmark:
        f"{BENCH}/{{home}}sample_{{exp}}_seed{{seed}}.tsv"
    priority: 20
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn sample-real --data {input.data} --num {params.num}"
        " --seed {wildcards.seed} --out {output} > {log} 2>&1"


rule fid_reference:
    input:
        test=lambda w: prepared_file(w.dataset, "test"),
    output:
        f"{RESULTS}/nonprivate/fid_ref_{{dataset}}.npz",  # = targets.fid_reference_file
    params:
        subset=FID_SUBSET,
        weights=flag("--weights", config["fid_weights"]),
        device=DEVICE,
    log:
        f"{LOGS}/fid_reference_{{dataset}}.log",
    benchmark:
        f"{BENCH}/fid_reference_{{dataset}}.tsv"
    priority: 20
    threads: 2
    resources:
        gpu=GPUS,
        mem_mb=8000,
        runtime=capped_minutes(config, 120),
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn fid-stats --samples {input.test} --out {output} {params.subset}"
        " {params.weights} {params.device} > {log} 2>&1"


rule fid:
    input:
        samples=experiment_file("samples_seed{seed}.npz"),  # scores may live elsewhere
        reference=fid_reference,
    output:
        f"{RESULTS}/{{home}}{{exp}}/fid_seed{{seed}}.json",
    params:
        weights=flag("--weights", config["fid_weights"]),
        device=DEVICE,
        sqrtm=EVAL["fid_sqrtm"],
    log:
        f"{LOGS}/{{home}}fid_{{exp}}_seed{{seed}}.log",
    benchmark:
        f"{BENCH}/{{home}}fid_{{exp}}_seed{{seed}}.tsv"
    priority: 10
    threads: 2
    resources:
        gpu=GPUS,
        mem_mb=8000,
        runtime=lambda w: eval_runtime_minutes(config, "fid", w.exp),
    group:
        EVAL_GROUP
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn fid --a {input.samples} --b {input.reference} --out {output}"
        " --sqrtm {params.sqrtm} {params.weights} {params.device} > {log} 2>&1"


# One job per (experiment, classifier) trains all seeds in one process (test set moved to
# the device once, no process start and CUDA set-up per seed); one result file per seed.
# The class count comes from the dataset definition (--dataset), never from the labels.
rule classify:
    input:
        train=lambda w: [experiment_file(f"samples_seed{s}.npz")(w) for s in SEEDS],
        test=dataset_file("test"),
    output:
        expand(f"{RESULTS}/{{{{home}}}}{{{{exp}}}}/acc_{{{{model}}}}_seed{{seed}}.json", seed=SEEDS),
    params:
        seeds=" ".join(map(str, SEEDS)),
        dataset=lambda wildcards: dataset_of(config, wildcards.exp),
        max_epochs=EVAL["max_epochs"],
        patience=EVAL["patience"],
        batch_size=EVAL["batch_size"],
        max_iter=EVAL["logreg_max_iter"],
        device=DEVICE,
    log:
        f"{LOGS}/{{home}}classify_{{exp}}_{{model}}.log",
    benchmark:
        f"{BENCH}/{{home}}classify_{{exp}}_{{model}}.tsv"
    # FID (priority 10) and sampling (20) go first: FID never waits for the classifiers.
    priority: 0
    threads: 2
    resources:
        gpu=lambda wildcards: classifier_gpus(wildcards.model),
        mem_mb=8000,
        runtime=lambda w: eval_runtime_minutes(config, "classify", w.exp),
    group:
        EVAL_GROUP
    conda:
        CONDA_ENV
    shell:
        "dpsinkhorn classify --model {wildcards.model} --train {input.train} --test {input.test}"
        " --seed {params.seeds} --out {output} --dataset {params.dataset}"
        " --max-epochs {params.max_epochs}"
        " --patience {params.patience} --batch-size {params.batch_size}"
        " --max-iter {params.max_iter} {params.device} > {log} 2>&1"
