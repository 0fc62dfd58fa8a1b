"""The README's library example, run as it stands: stochastic rounding draws new bits every step."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
from flax import nnx

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def library_example() -> str:
    """The python code block of the README's "## The library" section."""
    section = README.read_text().split("## The library", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the library section should hold one python block"
    return blocks[0]


def two_steps_on_one_batch(code: str) -> list[np.ndarray]:
    """Exec the example from scratch, then take the weight gradient of `layer` twice on the same batch."""
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102  (our own README)
    layer, x = namespace["layer"], namespace["x"]

    @nnx.jit
    def weight_gradient(layer, x):
        return nnx.grad(lambda layer: jnp.mean(jnp.square(layer(x).astype(jnp.float32))))(layer).kernel[...]

    return [np.asarray(weight_gradient(layer, x)) for _ in range(2)]


def test_the_readme_example_draws_new_stochastic_rounding_bits_every_step_and_replays_them():
    code = library_example()
    first, second = two_steps_on_one_batch(code)
    assert np.all(np.isfinite(first)) and not np.array_equal(first, second)  # new SR noise in step 2
    assert np.linalg.norm(first - second) < 0.5 * np.linalg.norm(first)  # noise around the same gradient
    replay = two_steps_on_one_batch(code)  # the whole example again, from scratch
    np.testing.assert_array_equal(replay[0], first)
    np.testing.assert_array_equal(replay[1], second)


def test_without_stochastic_rounding_the_two_steps_agree():
    """The control: the same example with round-to-nearest everywhere gives identical steps."""
    code = library_example()
    assert code.count('dot_general("nvfp4"') == 1
    first, second = two_steps_on_one_batch(code.replace('dot_general("nvfp4"', 'dot_general("nvfp4_no_sr"'))
    np.testing.assert_array_equal(first, second)
