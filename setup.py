"""Package list for setuptools (the rest of the metadata is in pyproject.toml).

The top-level ``cuda/`` folder is installed as the package ``gpukernels.cuda_sources``
so the CUDA sources ship inside the wheel and are found with importlib.resources."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["gpukernels", "gpukernels.*"]) + ["gpukernels.cuda_sources"],
    package_dir={"gpukernels.cuda_sources": "cuda"},
)
