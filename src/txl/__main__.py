"""``python -m txl`` runs the command line."""

import sys

from txl.cli import main

sys.exit(main())
