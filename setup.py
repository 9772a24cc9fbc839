"""Package discovery: the three import roots are the folders of the same names (attnhub,
attnhub_backends, attnhub_conformance) with every subpackage under them (any folder with an
``__init__.py``), so a new subpackage ships without being listed anywhere.

Everything else about the project is in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = ("attnhub", "attnhub_backends", "attnhub_conformance")

setup(packages=[p for p in find_packages(include=[f"{r}*" for r in ROOTS]) if p.split(".")[0] in ROOTS])
