"""Subcommands of `tlt`; see `tlt/cli.py`."""
