"""Stands in for `python -m fp4lm train` in the orchestration tests: writes synthetic metrics, no JAX.

Usage: fake_trainer.py CONTROL.json [CONFIG.yaml] section.key=value ...
CONTROL.json: {"calls": path of a log this appends the run label to,
               "fail": [labels that crash half-way once], "diverge": [labels that diverge]}
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from fp4lm.config import load_config  # noqa: E402
from tests.report.synthetic_runs import write_run  # noqa: E402


def main() -> int:
    control = json.loads(pathlib.Path(sys.argv[1]).read_text())
    overrides = dict(arg.split("=", 1) for arg in sys.argv[2:] if "=" in arg)
    run_dir = pathlib.Path(overrides["train.run_dir"])
    label, recipe = run_dir.name, overrides["precision.recipe"]
    with open(control["calls"], "a") as calls:
        calls.write(label + "\n")
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = sys.argv[2] if len(sys.argv) > 2 and "=" not in sys.argv[2] else None
    config = load_config(config_path, [f"{key}={value}" for key, value in overrides.items()]).to_dict()
    (run_dir / "config.json").write_text(json.dumps(config))  # as the trainer marks a run it starts
    print(f"fake training {label} ({recipe})")
    seed = int(overrides.get("train.seed", 0))
    # Every seed shifts all recipes alike (+0.02 per seed); a quantized recipe also moves by its own 0.004 per seed.
    offset = {"bf16": 0.0}.get(recipe, 0.05) + 0.02 * seed + (0.0 if recipe == "bf16" else 0.004 * seed)
    steps = int(overrides.get("train.steps", 40))
    if label in control.get("fail", []) and not (run_dir / "crashed_once").exists():
        write_run(run_dir, offset=offset, steps=steps // 2, finished=False)
        (run_dir / "crashed_once").write_text("")
        return 1
    if label in control.get("diverge", []):
        write_run(run_dir, offset=offset, steps=steps // 2, finished=False)
        print("training diverged")
        return 3
    bf16_after = overrides.get("precision.bf16_after")
    switch_at = int(float(bf16_after) * steps) if bf16_after else None
    write_run(run_dir, offset=offset, steps=steps, quantized=recipe != "bf16", switch_at=switch_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
