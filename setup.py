"""Package discovery: the three import roots live in folders named differently from them.

Everything else about the project is in pyproject.toml. Each root's subpackages are found (any
folder with an ``__init__.py``), so a new subpackage ships without being listed anywhere.
"""

from setuptools import find_packages, setup

#: import name -> folder
ROOTS = {"attnhub": "attnhub", "attnhub_backends": "backends", "attnhub_conformance": "conformance"}

setup(
    package_dir=ROOTS,
    packages=[
        f"{name}{'.' + sub if sub else ''}"
        for name, folder in ROOTS.items()
        for sub in ["", *find_packages(folder)]
    ],
)
