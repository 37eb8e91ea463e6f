"""``python -m stride.executor [serve]`` (the executor owns no database: no ``migrate``)."""

import sys

from stride.executor.app import build
from stride.executor.settings import ExecutorSettings
from stride.runtime.lifecycle import run_service

if __name__ == "__main__":
    sys.exit(run_service(ExecutorSettings, build, None))
