"""How a run stopped by a signal ends: the exception ``train`` raises and the command turns into an exit
code. Apart from the callbacks so that the command line can catch it without importing Lightning."""

from __future__ import annotations

import signal


class Stopped(BaseException):
    """Training stopped by a signal (SIGTERM, SIGINT); a command exits with 128 + ``signum``."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step = signum, step
