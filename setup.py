"""Packaging glue that pyproject.toml cannot express: the plugins in ``envs/`` install as ``aclarena_envs``.

Every sub-folder of ``envs/`` with an ``__init__.py`` becomes ``aclarena_envs.<name>``, so adding an
environment never means editing a list here.
"""

from setuptools import find_packages, setup

env_packages = ["aclarena_envs"] + [f"aclarena_envs.{p}" for p in find_packages("envs", exclude=["*.tests", "tests"])]

setup(
    packages=find_packages(include=["aclarena_slime", "aclarena_slime.*"]) + env_packages,
    package_dir={"aclarena_envs": "envs"},
)
