"""The projection: what a training step would cost on a datacenter GPU, per precision recipe.

- roofline.py: one GPU's step (GEMMs, quantization passes, attention, the rest) and its fitted efficiencies;
- layout.py: a job's parallel layout (TP, PP, VP, CP, EP, FSDP): its communication and pipeline bubble;
- projection.py: the per-recipe result, as a table or JSON;
- workload.py: the model and tokens per GPU being projected, and the limits the projection speaks for;
- calibration.py: the published measurements it was fitted on;
- command.py: `fp4lm project`.

The GPUs themselves are in fp4lm/hardware.py, shared with the trainer.
"""

from fp4lm.hardware import GPUS, GPUSpec, get_gpu
from fp4lm.project.calibration import PUBLISHED, CalibrationRow, calibration_report
from fp4lm.project.command import main_project, run_project
from fp4lm.project.layout import Layout, Network, Traffic, layout_step
from fp4lm.project.projection import Projection, RecipeProjection, parse_recipes, project
from fp4lm.project.roofline import (
    CALIBRATION,
    DEFAULT_RECIPES,
    RECIPE_COSTS,
    Calibration,
    RecipeCost,
    Workload,
    active_params,
    block_gemms,
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
    "Layout",
    "Network",
    "Projection",
    "RecipeCost",
    "RecipeProjection",
    "Traffic",
    "Workload",
    "active_params",
    "block_gemms",
    "calibration_report",
    "check_projectable",
    "get_gpu",
    "layout_step",
    "main_project",
    "parse_recipes",
    "project",
    "resolve_model",
    "run_project",
    "step_components",
    "workload_from_config",
    "workload_params",
]
