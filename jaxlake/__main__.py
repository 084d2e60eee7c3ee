"""python -m jaxlake: the jaxlake command."""

import sys

from jaxlake._src.cli import main

sys.exit(main())
