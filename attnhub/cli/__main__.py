"""``python -m attnhub.cli``: the ``attnhub`` command."""

from attnhub.cli import main

main()
