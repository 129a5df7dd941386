"""The ``quantsim`` command line: ``quantize``, ``inspect``, ``compare``, ``analyze`` and ``cache``.

It is the application layer above ``quantsim``, ``adaround`` and ``mixed_precision`` (``quantsim`` never imports
the algorithm packages, so the command line cannot live inside it) and uses only their public names. One
module per job: `arguments` (the parser), `data` (``--data``), `simbuild` (a sim from the options),
`metrics` (output agreement, timings), `report` (Markdown tables and ``report.md``), one ``cmd_*`` module per
subcommand, and `main` (logging, errors, exit codes).
"""
from quantsim_cli.main import main

__all__ = ["main"]
