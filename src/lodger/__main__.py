"""``python -m lodger`` runs the command line."""

from lodger.cli import main

main()
