"""Where numerics meets the matmul: recipes, the quantized dot_general, GEMM backends, layer policy, telemetry."""

from fp4lm.quant.dot import QuantizedDotGeneral, QuantizedDotModule, dot_general
from fp4lm.quant.policy import Policy
from fp4lm.quant.recipes import RECIPES, GemmShapeError, QuantSpec, Recipe, get_recipe

__all__ = [
    "RECIPES",
    "GemmShapeError",
    "Policy",
    "QuantSpec",
    "QuantizedDotGeneral",
    "QuantizedDotModule",
    "Recipe",
    "dot_general",
    "get_recipe",
]
