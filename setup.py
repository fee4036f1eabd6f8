"""Which folders the wheel holds, and under which name: each of the repository's top folders
becomes ``foldplane.<folder>`` (``agent/`` is ``foldplane.agent``), so the only top-level name an
install adds is ``foldplane``. The metadata is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ["agent", "api", "benchmarks", "coordinator", "eventlog", "migrations", "wire"]

packages = ["foldplane"]
package_dir = {"foldplane": "foldplane"}
for folder in FOLDERS:
    package_dir[f"foldplane.{folder}"] = folder
    packages += [f"foldplane.{folder}"]
    packages += [f"foldplane.{folder}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
