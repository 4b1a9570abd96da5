"""``python -m eventop.watcher run|record|replay|emit`` (see ``--help``)."""

import sys

from eventop.watcher.cli import main

sys.exit(main())
