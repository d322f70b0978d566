"""Packaging shim: the Alembic migrations live in the top-level `migrations/` folder and install as
`tuner.migrations` (a package-dir mapping that pyproject's automatic discovery cannot express)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tuner", "tuner.*"], exclude=["tuner.migrations", "tuner.migrations.*"]),
              "tuner.migrations", "tuner.migrations.versions"],  # versions/ holds modules without an __init__.py
    package_dir={"tuner.migrations": "migrations"},
)
