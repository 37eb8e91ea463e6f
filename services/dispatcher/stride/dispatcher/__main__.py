"""``python -m stride.dispatcher [serve|migrate]``."""

import sys

from stride.dispatcher.app import MIGRATIONS, build
from stride.dispatcher.settings import DispatcherSettings
from stride.runtime.lifecycle import run_service
from stride.wiring import migrate_command

if __name__ == "__main__":
    sys.exit(run_service(DispatcherSettings, build, migrate_command(MIGRATIONS)))
