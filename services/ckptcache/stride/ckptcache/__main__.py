"""``python -m stride.ckptcache [serve]`` (the cache owns no database, so no ``migrate``)."""

import sys

from stride.ckptcache.app import build
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.runtime.lifecycle import run_service

if __name__ == "__main__":
    sys.exit(run_service(CheckpointCacheSettings, build, None))
