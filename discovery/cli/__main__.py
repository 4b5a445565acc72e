"""`python -m discovery.cli` is the `toolreg` script."""

import sys

from discovery.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
