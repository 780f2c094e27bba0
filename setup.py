"""Maps the top-level layer folders onto the `evoharness.*` namespace.

The repository keeps one folder per layer (`sdk/`, `harness/`, `evolve/`, `examples/`); they
install as `evoharness.sdk`, ... so that nothing named `sdk` or `harness` lands at the top of
site-packages. All other metadata lives in pyproject.toml.
"""

from setuptools import find_packages, setup

LAYERS = ("sdk", "harness", "evolve", "examples")

packages: list[str] = []
for layer in LAYERS:
    packages.append(f"evoharness.{layer}")
    packages.extend(f"evoharness.{layer}.{sub}" for sub in find_packages(layer))

setup(
    packages=packages,
    package_dir={f"evoharness.{layer}": layer for layer in LAYERS},
)
