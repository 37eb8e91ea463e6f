"""``python -m stride.admission [serve|migrate]``."""

import sys

from stride.admission.app import MIGRATIONS, build
from stride.admission.settings import AdmissionSettings
from stride.runtime.lifecycle import run_service
from stride.wiring import migrate_command

if __name__ == "__main__":
    sys.exit(run_service(AdmissionSettings, build, migrate_command(MIGRATIONS)))
