"""``python -m watcher run|record|replay|emit`` (see ``--help``)."""

import sys

from watcher.cli import main

sys.exit(main())
