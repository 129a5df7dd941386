"""``python -m quantsim_cli``: the ``quantsim`` command line (same as ``python -m quantsim``)."""
import sys

from quantsim_cli.main import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
