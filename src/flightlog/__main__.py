"""``python -m flightlog`` is the ``flightlog`` command."""

import sys

from flightlog.cli import main

sys.exit(main())
