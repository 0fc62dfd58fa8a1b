"""The lock file and the package's requirements agree: `make` installs exactly what pyproject.toml allows."""

import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK_TEXT = (ROOT / "requirements.lock").read_text()
# `name==version ; marker \` at the start of a line, followed by its hashes.
PINS = {
    canonicalize_name(name): version
    for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", LOCK_TEXT, re.MULTILINE)
}
# Packages whose API or numerics move between minor releases: each needs an upper bound.
BOUNDED = {"jax", "flax", "optax", "orbax-checkpoint", "grain"}


def _requirements(extra=None):
    lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_every_requirement_is_locked_within_its_bounds():
    required = _requirements() + [r for extra in PROJECT["optional-dependencies"] for r in _requirements(extra)]
    for requirement in required:
        if canonicalize_name(requirement.name) == "fp4lm":  # the package's own extras
            continue
        pinned = PINS.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} is not in requirements.lock; run `make lock`"
        assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)


def test_every_pin_carries_hashes():
    entries = re.split(r"\n(?=[A-Za-z0-9])", LOCK_TEXT.split("\n", 2)[2])  # after the two header lines
    pinned_entries = [entry for entry in entries if "==" in entry.split("\n", 1)[0]]
    assert len(pinned_entries) == len(PINS) > 20
    for entry in pinned_entries:
        assert "--hash=sha256:" in entry, entry.split("\n", 1)[0]


def test_moving_apis_have_upper_bounds():
    bounded = {
        canonicalize_name(r.name) for r in _requirements() if any(spec.operator in ("<", "<=") for spec in r.specifier)
    }
    assert bounded >= BOUNDED


def test_heavy_optional_packages_are_extras_that_dev_installs():
    runtime = {canonicalize_name(r.name) for r in _requirements()}
    extras = PROJECT["optional-dependencies"]
    heavy = (
        ("report", "matplotlib"),
        ("progress", "rich"),
        ("tensorboard", "tensorboardx"),
        ("sentencepiece", "sentencepiece"),
    )
    for extra, package in heavy:
        assert package not in runtime
        assert [canonicalize_name(r.name) for r in _requirements(extra)] == [package]
    assert Requirement(extras["all"][0]).extras == {extra for extra, _ in heavy}
    assert any(Requirement(line).extras == {"all"} for line in extras["dev"])
