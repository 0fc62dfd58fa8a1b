"""Which recipe each linear layer uses: ordered rules over layer paths, first match wins.

Layer paths look like ``blocks.3.attn.q`` or ``blocks.3.mlp.down``. Resolution order for a path:

1. the user's ``rules``, in order — ``(regex, recipe name)`` (or ``"REGEX=RECIPE"``), the regex must match
   the whole path; explicit rules come first so they can override anything;
2. the bf16 sugar: ``bf16_first_layers`` / ``bf16_last_layers`` keep whole blocks in bf16 (the paper keeps
   ~15 % of linear layers in bf16, mostly the last ones);
3. the default ``recipe``.

`Policy.from_config(config)` builds the run's policy and checks it against the model's linear layers: every
rule matches a layer, and every quantized layer's widths fit its recipe's blocks.

Only linear layers go through a policy. Embeddings, the LM head, attention's score/value matmuls, norms and
softmax never call `dot_general_for`, so they stay in higher precision by construction. The policy also carries
``attention`` (precision.attention), which the attention core reads: "fp8" runs its score/value matmuls in
per-tensor FP8 (fp4lm.model.attention); the late switch to bf16 (`Policy.bf16`) turns that off too.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import get_args

from fp4lm.config import AttentionPrecision, Config, PrecisionConfig, split_precision_rule
from fp4lm.config.combinations import check_bf16_layers
from fp4lm.config.fields import check_field
from fp4lm.errors import UserError
from fp4lm.linear_layers import LinearLayer, linear_layers
from fp4lm.quant.dot import QuantizedDotGeneral, dot_general
from fp4lm.quant.gemm import BACKENDS
from fp4lm.quant.grouped import check_grouped_formats
from fp4lm.quant.recipes import RECIPES, GemmShapeError, Recipe, get_recipe


def normalise_rules(rules) -> tuple[tuple[str, str], ...]:
    """Rules as a tuple of (pattern, recipe) pairs; accepts pairs, a mapping, or "pattern=recipe" strings."""
    if isinstance(rules, Mapping):
        rules = list(rules.items())
    pairs = []
    for rule in rules:
        if isinstance(rule, str):
            pattern, recipe = split_precision_rule(rule)
        elif isinstance(rule, Mapping) and set(rule) == {"pattern", "recipe"}:
            pattern, recipe = rule["pattern"], rule["recipe"]
        else:
            try:
                pattern, recipe = rule
            except (TypeError, ValueError):
                raise UserError(
                    f"precision rule {rule!r} is not a (regex, recipe) pair; write it as ['REGEX', 'RECIPE']"
                ) from None
        pairs.append((str(pattern), str(recipe)))
    return tuple(pairs)


@dataclass(frozen=True)
class Policy:
    """Per-layer precision: a frozen, hashable value (it is static under jit)."""

    recipe: str = "nvfp4"
    _: KW_ONLY
    num_layers: int
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    rules: tuple[tuple[str, str], ...] = ()
    backend: str = "auto"
    shared_weight_scale: bool = False  # the layers of a fused group (q/k/v, gate/up) share one NVFP4 weight amax
    attention: str = "bf16"  # precision.attention: the attention core's QKᵀ and P·V in bf16 or fp8
    fp4_param_gather: bool = False  # under FSDP, gather quantized layers' weights as NVFP4 tiles (weight_gather.py)

    def __post_init__(self):
        object.__setattr__(self, "rules", normalise_rules(self.rules))
        get_recipe(self.recipe)
        for pattern, recipe in self.rules:
            get_recipe(recipe)
            try:
                re.compile(pattern)
            except re.error as err:
                raise UserError(f"precision rule regex {pattern!r} is invalid ({err}); fix the pattern") from None
        if self.backend not in BACKENDS:
            raise UserError(f"unknown GEMM backend {self.backend!r}; use one of {', '.join(BACKENDS)}")
        for name in ("bf16_first_layers", "bf16_last_layers"):
            check_field(PrecisionConfig, name, f"precision.{name}", getattr(self, name))
        check_bf16_layers(self.bf16_first_layers, self.bf16_last_layers, self.num_layers)
        if self.attention not in get_args(AttentionPrecision):
            choices = ", ".join(get_args(AttentionPrecision))
            raise UserError(f"unknown attention precision {self.attention!r}; use one of {choices}")

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        """The run's policy (`config.precision` over `config.model`'s blocks), checked against the model's
        linear layers: a rule that matches none, or a quantized width its recipe cannot block, is a UserError."""
        p = config.precision
        policy = cls(
            p.recipe,
            num_layers=config.model.num_layers,
            bf16_first_layers=p.bf16_first_layers,
            bf16_last_layers=p.bf16_last_layers,
            rules=normalise_rules(p.rules),
            backend=p.backend,
            shared_weight_scale=p.shared_weight_scale,
            attention=p.attention,
            fp4_param_gather=p.fp4_param_gather,
        )
        policy.validate([layer.path for layer in linear_layers(config.model)])
        check_quantized_widths(config, policy)
        check_fp4_param_gather(config, policy)
        return policy

    @classmethod
    def bf16(cls, num_layers: int = 0) -> Policy:
        """Everything in bf16."""
        return cls("bf16", num_layers=num_layers)

    def resolved_rules(self) -> tuple[tuple[str, str, str], ...]:
        """All rules in match order as (origin, regex, recipe); origin names where the rule came from."""
        sugar = []
        if self.bf16_first_layers:
            ids = "|".join(str(i) for i in range(self.bf16_first_layers))
            sugar.append((f"bf16_first_layers={self.bf16_first_layers}", rf"blocks\.({ids})\..*", "bf16"))
        if self.bf16_last_layers:
            first_last = self.num_layers - self.bf16_last_layers
            ids = "|".join(str(i) for i in range(first_last, self.num_layers))
            sugar.append((f"bf16_last_layers={self.bf16_last_layers}", rf"blocks\.({ids})\..*", "bf16"))
        user = [(f"rule {pattern!r}", pattern, recipe) for pattern, recipe in self.rules]
        return tuple(user + sugar)

    def recipe_name_for(self, path: str) -> str:
        for _origin, pattern, recipe in self.resolved_rules():
            if re.fullmatch(pattern, path):
                return recipe
        return self.recipe

    def recipe_for(self, path: str) -> Recipe:
        return RECIPES[self.recipe_name_for(path)]

    def layer_seed(self, path: str) -> int:
        """A stable 31-bit hash of the path (crc32): the same on every run, host and device."""
        return zlib.crc32(path.encode("utf-8")) & 0x7FFFFFFF

    def dot_general_for(self, path: str) -> QuantizedDotGeneral:
        """The quantized ``dot_general`` for this layer; its errors name ``path``.

        A call that draws stochastic-rounding bits (differentiating nvfp4) needs
        ``key=jax.random.fold_in(step_key, policy.layer_seed(path))``; without one it raises.
        """
        return dot_general(self.recipe_for(path), backend=self.backend, name=path)

    def validate(self, paths: Iterable[str]) -> None:
        """A rule (or bf16 sugar) that matches none of ``paths`` is a mistake: raise UserError. A MoE router
        (``blocks.{i}.mlp.router``) is no linear layer of the policy: it stays float32, whatever the rules."""
        paths = list(paths)
        routers = [p.removesuffix(".experts.gate") + ".router" for p in paths if p.endswith(".mlp.experts.gate")]
        for origin, pattern, _recipe in self.resolved_rules():
            names_a_router = any(re.fullmatch(pattern, router) for router in routers)
            if not any(re.fullmatch(pattern, p) for p in paths) and names_a_router:
                raise UserError(
                    f"precision {origin} names the MoE router, which stays float32 and is never quantized; "
                    r"remove the rule (the experts are blocks\.N\.mlp\.experts\..*, shared ones ...mlp\.shared\..*)"
                )
            if not any(re.fullmatch(pattern, p) for p in paths):
                example = paths[0] if paths else "<none>"
                raise UserError(
                    f"precision {origin} matches no linear layer (e.g. {example!r}, {len(paths)} layers, "
                    f"num_layers={self.num_layers}); fix the regex or remove the rule"
                )

    def assignments(self, paths: Iterable[str]) -> dict[str, str]:
        return {p: self.recipe_name_for(p) for p in paths}

    def table(self, paths: Iterable[str]) -> str:
        """A printable two-column table: layer path, recipe."""
        assigned = self.assignments(paths)
        width = max([len("layer")] + [len(p) for p in assigned])
        lines = [f"{'layer':<{width}}  recipe", f"{'-' * width}  ------"]
        lines += [f"{p:<{width}}  {r}" for p, r in assigned.items()]
        return "\n".join(lines)

    def summary(self, paths: Iterable[str]) -> str:
        """E.g. ``"nvfp4: 20 of 24 linear layers; bf16: 4 of 24 linear layers"`` (most used first)."""
        counts = Counter(self.assignments(paths).values())
        total = sum(counts.values())
        return "; ".join(f"{name}: {n} of {total} linear layers" for name, n in counts.most_common())


def _width_keys(config: Config) -> dict[int, str]:
    """The setting behind each width of the linear layers (a width that several give is named by the first)."""
    m = config.model
    keys: dict[int, str] = {}
    for size, key in (
        (m.d_model, "model.d_model"),
        (m.mlp_dim, "model.mlp_dim"),
        (m.num_heads * m.resolved_head_dim, "model.num_heads * head_dim"),
        (m.num_kv_heads * m.resolved_head_dim, "model.num_kv_heads * head_dim"),
        (m.resolved_moe_mlp_dim, "model.moe_mlp_dim"),
        (m.num_shared_experts * m.resolved_moe_mlp_dim, "model.num_shared_experts * moe_mlp_dim"),
    ):
        keys.setdefault(size, key)
    return keys


def check_quantized_widths(config: Config, policy: Policy) -> None:
    """Every quantized layer's widths (and the token count) must be multiples of its recipe's blocks.

    The rule is the recipe's (`Recipe.check_gemm_shapes`, the same one the quantized matmul applies when
    traced); this adds the setting to change. The token axis M is contracted by the weight-gradient GEMM,
    so the tokens of a step, train.batch_size * data.seq_len, must be a multiple too (of a micro-batch,
    train.batch_size / train.grad_accum_steps * data.seq_len, with gradient accumulation). Routed experts
    pad each expert's tokens instead (fp4lm.quant.grouped), and need a format their grouped GEMM quantizes.
    """
    accum = config.train.grad_accum_steps
    tokens = config.train.batch_size // accum * config.data.seq_len
    tokens_key = "train.batch_size * data.seq_len" if accum == 1 else "train.batch_size / grad_accum_steps * seq_len"
    width_keys = _width_keys(config)
    for layer in linear_layers(config.model):
        recipe = policy.recipe_for(layer.path)
        if layer.experts:
            check_grouped_formats(recipe, where=f"layer {layer.path}")
        try:
            m = None if layer.experts else tokens
            recipe.check_gemm_shapes(m=m, n=layer.out_features, k=layer.in_features, where=f"layer {layer.path}")
        except GemmShapeError as error:
            key = tokens_key if error.axis == "M" else width_keys[error.size]
            spec = getattr(recipe, error.slot)
            raise UserError(
                f"{key}={error.size} is not a multiple of {error.multiple}, which recipe {recipe.name!r} needs "
                f"({error.slot}: {spec.describe()}, layer {layer.path}); make {key} a multiple of {error.multiple} "
                "or keep the layer in bf16 (precision.rules, precision.bf16_first/last_layers)"
            ) from None


def fp4_gathered_layers(config: Config, policy: Policy) -> list[LinearLayer]:
    """The layers precision.fp4_param_gather gathers in 4 bits: every quantized one but the routed experts,
    which keep their own gather (fp4lm.model.expert_parallel); bf16 layers gather their bf16 weights."""
    if not policy.fp4_param_gather:
        return []
    return [
        layer
        for layer in linear_layers(config.model)
        if not layer.experts and policy.recipe_for(layer.path).is_quantized
    ]


def check_fp4_param_gather(config: Config, policy: Policy) -> None:
    """Each layer precision.fp4_param_gather gathers needs a recipe with one 16x16 NVFP4 weight copy
    (`Recipe.shares_weight_tiles`)."""
    for layer in fp4_gathered_layers(config, policy):
        recipe = policy.recipe_for(layer.path)
        if recipe.shares_weight_tiles:
            continue
        raise UserError(
            f"precision.fp4_param_gather=true gathers each weight as its 16x16 NVFP4 tiles, but recipe "
            f"{recipe.name!r} (layer {layer.path}) quantizes its weight otherwise ({_weight_copies(recipe)}); use "
            f"one of {', '.join(name for name, r in RECIPES.items() if r.shares_weight_tiles)}, or set "
            "precision.fp4_param_gather=false"
        )


def _weight_copies(recipe: Recipe) -> str:
    dgrad = recipe.dgrad_w.describe() if recipe.dgrad_w else "bf16"
    fprop = recipe.fprop_w.describe() if recipe.fprop_w else "bf16"
    return f"forward {fprop}, dgrad {dgrad}"
