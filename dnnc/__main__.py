"""`python -m dnnc ...`: the same as the `dnnc` command."""

import sys

from .compiler.cli import main

sys.exit(main())
