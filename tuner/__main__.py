"""`python -m tuner` is the `tuner` command."""

from tuner.cli.main import main

main()
