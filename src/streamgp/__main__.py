"""``python -m streamgp`` runs the command line (see :mod:`streamgp.cli`)."""

import sys

from streamgp.cli import main

sys.exit(main())
