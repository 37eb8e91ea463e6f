"""``python -m stride.agent [serve]`` (the agent owns no database, so no ``migrate``)."""

import sys

from stride.agent.app import build
from stride.agent.settings import AgentSettings
from stride.runtime.lifecycle import run_service

if __name__ == "__main__":
    sys.exit(run_service(AgentSettings, build, None))
