"""``python -m stride.ckptcache [serve]`` (the cache owns no database, so no ``migrate``)."""

import signal
import sys

from stride.ckptcache.app import build
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.runtime.lifecycle import run_service

if __name__ == "__main__":
    # A file-size limit (ulimit -f) would kill the cache with SIGXFSZ in the middle of a
    # persist; ignored, the write fails with EFBIG instead, which the persister reports
    # like a full disk while the checkpoint stays in memory.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sys.exit(run_service(CheckpointCacheSettings, build, None))
