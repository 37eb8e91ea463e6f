"""``python -m stride.optimizer [serve|migrate]``."""

import sys

from stride.optimizer.app import MIGRATIONS, build
from stride.optimizer.settings import OptimizerSettings
from stride.runtime.lifecycle import run_service
from stride.wiring import migrate_command

if __name__ == "__main__":
    sys.exit(run_service(OptimizerSettings, build, migrate_command(MIGRATIONS)))
