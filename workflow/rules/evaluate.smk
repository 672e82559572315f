# One job per experiment evaluates it whole (dpsinkhorn.evaluate.job): every seed's
# samples, FID against the cached reference statistics and the classifiers, seeds batched,
# in one process (one generator load, one Inception load, one test-set transfer). Its
# outputs are still one file per cell, so one cell is rerun by asking for its file. The
# rule is made per experiment (evaluate_<exp>), as its outputs differ (no classifiers for
# an unconditional generator, none of Log-Reg on CelebA); its runtime request comes from
# dpsinkhorn.config.cluster.eval_runtime_minutes.


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
        "dpsinkhorn fid-stats --samples {input.test:q} --out {output} {params.subset}"
        " {params.weights} {params.device} > {log} 2>&1"


for exp in experiment_names(config):
    trained = exp in trained_experiments(config)
    models = experiment_classifiers(config, exp)

    rule:
        name:
            f"evaluate_{exp}"
        input:
            source=(
                f"{experiment_dir(config, RESULTS, exp)}/generator.pt"
                if trained
                else prepared_file(dataset_of(config, exp), "train")
            ),
            test=prepared_file(dataset_of(config, exp), "test"),
            reference=targets.fid_reference_file(RESULTS, dataset_of(config, exp)),
        output:
            samples=targets.sample_files(config, RESULTS, [exp]),
            scores=targets.evaluation_files(config, RESULTS, [exp]),
        params:
            source="--generator" if trained else "--real-data",
            seeds=" ".join(map(str, SEEDS)),
            samples_dir=experiment_dir(config, RESULTS, exp),
            scores_dir=evaluation_dir(config, RESULTS, exp),
            classifiers=" ".join(models),
            dataset=dataset_of(config, exp),
            num=EVAL["num_samples"],
            options=EVAL_OPTIONS,
            device=DEVICE,
        log:
            f"{LOGS}/{experiment_home(config, exp)}evaluate_{exp}.log",
        benchmark:
            f"{BENCH}/{experiment_home(config, exp)}evaluate_{exp}.tsv"
        priority: 10
        threads: 2
        resources:
            gpu=GPUS,
            mem_mb=16000,
            runtime=eval_runtime_minutes(config, exp),
        conda:
            CONDA_ENV
        shell:
            "dpsinkhorn evaluate {params.source} {input.source:q} --test {input.test:q}"
            " --reference {input.reference:q} --seed {params.seeds} --num {params.num}"
            " --samples-dir {params.samples_dir} --scores-dir {params.scores_dir}"
            " --classifiers {params.classifiers} --dataset {params.dataset}"
            " {params.options} {params.device} > {log} 2>&1"
