"""`fp4lm prepare`'s spawned workers import fp4lm.data.prepare: that must not pull in JAX or grain."""

import subprocess
import sys

import pytest


def test_prepare_worker_imports_without_jax():
    code = (
        "import sys\n"
        "import fp4lm.data.prepare as prepare\n"
        "prepare.open_tokenizer('byte')\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'grain', 'flax'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "", f"fp4lm.data.prepare imported {result.stdout.strip()}"


def test_package_names_load_on_first_use():
    import fp4lm.data as data
    from fp4lm.data.training_data import build

    assert data.build is build
    assert sorted(data.__all__) == sorted(data._EXPORTS)  # every name listed loads
    assert all(getattr(data, name) is not None for name in data.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        data.no_such_name  # noqa: B018
