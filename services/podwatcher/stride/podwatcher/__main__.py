"""``python -m stride.podwatcher [serve|migrate]``."""

import sys

from stride.podwatcher.app import MIGRATIONS, build
from stride.podwatcher.settings import PodWatcherSettings
from stride.runtime.lifecycle import run_service
from stride.wiring import migrate_command

if __name__ == "__main__":
    sys.exit(run_service(PodWatcherSettings, build, migrate_command(MIGRATIONS)))
