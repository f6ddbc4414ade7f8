"""``python -m eventbus`` runs the command line."""

from .cli import main

main()
