"""Where numerics meets the matmul: recipes, the quantized dot_general, GEMM backends, layer policy, telemetry."""

from fp4lm.quant.dot import QuantizedDotGeneral, dot_general
from fp4lm.quant.policy import Policy
from fp4lm.quant.recipes import RECIPES, QuantSpec, Recipe, get_recipe

__all__ = ["RECIPES", "Policy", "QuantSpec", "QuantizedDotGeneral", "Recipe", "dot_general", "get_recipe"]
