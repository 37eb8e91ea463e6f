"""``python -m stride.configdb [serve|migrate]``."""

import sys

from stride.configdb.app import MIGRATIONS, build
from stride.configdb.settings import ConfigDbSettings
from stride.runtime.lifecycle import run_service
from stride.wiring import migrate_command

if __name__ == "__main__":
    sys.exit(run_service(ConfigDbSettings, build, migrate_command(MIGRATIONS)))
