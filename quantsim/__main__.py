"""``python -m quantsim``: the command line, which lives in the ``quantsim_cli`` package.

The command line drives ``adaround`` and ``mixed_precision`` as well, which build on ``quantsim``; so it
sits above all three and ``quantsim`` itself imports none of them. This launcher only hands over to it.
"""
import sys

__all__: list[str] = []

if __name__ == "__main__":
    from quantsim_cli.main import main

    sys.exit(main())
