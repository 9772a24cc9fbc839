"""attnhub's conformance suite: certify any registered backend against the float64 reference.

Run it with ``attnhub certify NAME [--quick]`` (see docs/conformance.md). The package is also a
pytest plugin (entry point ``pytest11``) that only adds ``--attnhub-*`` options and fixtures; the
cases are collected only from :mod:`attnhub_conformance.suite`, which ``certify`` runs. Nothing is
imported here so that loading the plugin costs ordinary test runs nothing.

Modules: ``cases`` (the grids), ``runner`` (one case against the reference), ``plugin`` and
``suite`` (pytest), ``report`` (matrix, JSON, Markdown), ``matrix`` (support matrix from reports),
``cli`` (``attnhub certify``).
"""
