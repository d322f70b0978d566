"""Start and supervise the worker processes of one `tuner run`: N CPU workers or one per GPU.

A worker gets the storage URL through an inherited pipe (`--storage-fd`), never on its command line,
where every local user could read the password (`ps`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tuner.worker.lifeline import PARENT_ENV


@dataclass
class Pool:
    """Worker processes; each is a `tuner.worker.main` subprocess (so it can be signalled on its own)."""

    spec_path: Path
    url: str
    budget: int
    workers: int = 1
    gpus: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        """Launch the workers; with GPUs, worker i sees only GPU gpus[i] (CUDA_VISIBLE_DEVICES)."""
        count = len(self.gpus) or self.workers
        for i in range(count):
            env = dict(os.environ)
            if self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = self.gpus[i]
            env[PARENT_ENV] = str(os.getpid())
            read_fd, write_fd = os.pipe()
            cmd = [
                sys.executable,
                "-m",
                "tuner.worker.main",
                str(self.spec_path),
                "--storage-fd",
                str(read_fd),
                "--budget",
                str(self.budget),
                "--index",
                str(i),
            ]
            try:
                self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, pass_fds=(read_fd,)))
                with os.fdopen(write_fd, "w") as pipe:
                    write_fd = -1
                    pipe.write(self.url)
            finally:
                os.close(read_fd)
                if write_fd >= 0:
                    os.close(write_fd)

    def alive(self) -> int:
        """How many workers are still running (reaps the exited ones)."""
        return sum(1 for p in self.procs if p.poll() is None)

    def stop(self) -> None:
        """Ask every worker to stop (SIGTERM): each fails and re-queues its trial in flight."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def wait(self) -> list[int]:
        """Wait for all workers; their exit statuses."""
        return [p.wait() for p in self.procs]
