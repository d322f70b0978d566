"""The `tuner` command line."""
