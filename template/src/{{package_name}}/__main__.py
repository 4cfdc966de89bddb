"""`python -m <package>` runs the same command line as the console script (template-owned)."""

from .cli import main

main()
