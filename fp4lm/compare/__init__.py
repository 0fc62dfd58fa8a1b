"""`fp4lm compare`: train several precision recipes with identical settings and report them side by side.

    fp4lm compare [CONFIG.yaml] --recipes bf16,nvfp4,... [--preset quick|standard|gpu] [--out DIR]
                  [--seeds N | --seeds 0,1,2] [--ablations nvfp4_no_rht,...] [--reuse DIR ...]
                  [section.key=value ...]

Every recipe gets the same config (so the same seed, data order and hyperparameters); only
`precision.recipe`, the run directory and the entry's own `@section.key=value` overrides differ. Recipes
run one after another, each in its own `fp4lm train` subprocess with run directory DIR/runs/<label>.
When a run finishes its record is written to DIR/records/<label>.json; a later invocation reuses every
record it finds (no retraining) and resumes an interrupted run from its checkpoint. After each recipe the
report (results.json, PNGs, report.html, report.md) is rewritten from the records present, so a
comparison cut short still leaves a readable report of what finished; at the end the results table is printed.

With `--seeds`, every recipe runs once per seed (train.seed=s: the model's initialisation, the data order and
the stochastic-rounding keys all follow it, so on one seed every recipe starts from the same weights and sees
the same batches); run s of recipe LABEL is DIR/runs/LABEL_seed-s with record DIR/records/LABEL_seed-s.json.
`--ablations` lists recipes that run on the first seed only and are marked "single seed" in the report. A
record missing from DIR/records/ is taken from any record in DIR/records/ or in a `--reuse` comparison whose
settings are identical (copied, with `reused_from` naming its source), so seed 0 of an earlier one-seed
comparison is not trained again. The report gives each recipe's mean over its seeds and the gap to bf16 with a
95% confidence interval from the paired per-seed differences (fp4lm.report.stats).

Everything that can be checked before training is checked before anything is written: the recipes, the preset,
the overrides (each recipe's config as the trainer will check it, with its memory estimate and run
directory), the data path, the matplotlib extra, the reuse of existing records, and the --out directory
(which must be new, empty or a comparison; `--force` moves anything else aside, never deleting it).

Modules: comparison.py (the command), specs.py (the --recipes syntax), presets.py (run sizes), runner.py (one
training subprocess), records.py (what a finished run leaves for the report). Rendering is fp4lm.report's.
"""
