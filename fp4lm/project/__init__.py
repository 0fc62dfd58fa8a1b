"""The projection: what a training step would cost on a datacenter GPU, per precision recipe.

- roofline.py: the step model (GEMMs, quantization passes, attention, the rest) and its fitted efficiencies;
- workload.py: the model and tokens per GPU being projected, and the limits the projection speaks for;
- calibration.py: the published measurements it was fitted on;
- command.py: `fp4lm project`.

The GPUs themselves are in fp4lm/hardware.py, shared with the trainer.
"""

from fp4lm.hardware import GPUS, GPUSpec, get_gpu
from fp4lm.project.calibration import PUBLISHED, CalibrationRow, calibration_report
from fp4lm.project.command import main_project, run_project
from fp4lm.project.roofline import (
    CALIBRATION,
    DEFAULT_RECIPES,
    RECIPE_COSTS,
    Calibration,
    Projection,
    RecipeCost,
    RecipeProjection,
    Workload,
    active_params,
    block_gemms,
    parse_recipes,
    project,
    step_components,
    workload_params,
)
from fp4lm.project.workload import (
    MAX_PARAMS,
    MAX_SEQ_LEN,
    MAX_TOKENS_PER_GPU,
    check_projectable,
    resolve_model,
    workload_from_config,
)

__all__ = [
    "CALIBRATION",
    "DEFAULT_RECIPES",
    "GPUS",
    "MAX_PARAMS",
    "MAX_SEQ_LEN",
    "MAX_TOKENS_PER_GPU",
    "PUBLISHED",
    "RECIPE_COSTS",
    "Calibration",
    "CalibrationRow",
    "GPUSpec",
    "Projection",
    "RecipeCost",
    "RecipeProjection",
    "Workload",
    "active_params",
    "block_gemms",
    "calibration_report",
    "check_projectable",
    "get_gpu",
    "main_project",
    "parse_recipes",
    "project",
    "resolve_model",
    "run_project",
    "step_components",
    "workload_from_config",
    "workload_params",
]
