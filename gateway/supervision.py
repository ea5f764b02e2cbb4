"""A worker of `gateway serve --workers N` stops with its supervisor.

uvicorn's supervisor stops its workers when it is told to stop, but if it is killed
outright (SIGKILL, the OOM killer) they go on serving the port, and a gateway started
again finds the port taken. So the supervisor names itself in the environment its
workers inherit, and each worker asks Linux for a SIGTERM - a graceful stop, that
finishes and books the calls under way - when its parent dies."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

SUPERVISOR_ENV = "GATEWAY_SUPERVISOR_PID"
PR_SET_PDEATHSIG = 1  # prctl(2)


def stop_with_supervisor(environ: Mapping[str, str]) -> None:
    """In a worker (the variable set): arrange the SIGTERM."""
    supervisor = environ.get(SUPERVISOR_ENV)
    if supervisor is None or sys.platform != "linux":
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) == 0 and os.getppid() != int(supervisor):
        os.kill(os.getpid(), signal.SIGTERM)  # it died before the request took effect
