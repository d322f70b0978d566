"""Start and supervise the worker processes of one `tuner run`: N CPU workers or one per GPU.

A worker gets the storage URL through an inherited pipe, never on its command line, where every
local user could read the password (`ps`). CPU workers are forked from the study's pre-imported
server (`study_server`, `tuner.worker.forkserver`), which forks their trials' children and the
reference run too; GPU workers, and every worker where the server is off or does not answer, are
fresh interpreters (`python -m tuner.worker.main`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tuner.backends.base import Backend
from tuner.spec.model import DEFAULT_SAMPLER
from tuner.worker import forkserver
from tuner.worker.isolate import child_env
from tuner.worker.lifeline import PARENT_ENV

STORAGE_FD_ENV = "TUNER_STORAGE_FD"  # a forked worker's inherited pipe that holds the storage URL
SURROGATE_MODULES = ("sklearn.ensemble", "sklearn.linear_model")  # what the local search's first fit imports


class WorkerProcess(Protocol):
    """What the pool uses of a worker process: `subprocess.Popen`'s, or a forked worker's (`ForkedChild`)."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def study_server(backend: Backend, sampler: str) -> forkserver.Connection | None:
    """The study's server, importing the worker, the reference run, the backend's modules for forked children and what
    the sampler loads (started now, ready later, so that its imports overlap the caller's own work); None where
    processes are not forked here."""
    if not forkserver.enabled():
        return None
    modules = [forkserver.WORKER_MODULE, forkserver.REFERENCE_MODULE]
    if backend.preload:
        modules += [type(backend).__module__, *backend.preload]
    if sampler == DEFAULT_SAMPLER:
        modules += SURROGATE_MODULES
    return forkserver.server_for(modules, child_env())


@dataclass
class Pool:
    """Worker processes; each one a process of its own (so it can be signalled on its own)."""

    spec_path: Path
    url: str
    budget: int
    workers: int = 1
    gpus: list[str] = field(default_factory=list)
    server: forkserver.Connection | None = None  # CPU workers are forked from it (`study_server`)
    procs: list[WorkerProcess] = field(default_factory=list)

    def start(self) -> None:
        """Launch the workers; with GPUs, worker i sees only GPU gpus[i] (CUDA_VISIBLE_DEVICES)."""
        count = len(self.gpus) or self.workers
        for i in range(count):
            env = dict(os.environ)
            if self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = self.gpus[i]
            env[PARENT_ENV] = str(os.getpid())
            read_fd, write_fd = os.pipe()
            args = [str(self.spec_path), "--budget", str(self.budget), "--index", str(i)]
            try:
                self.procs.append(self._launch(args, env, read_fd))
                with os.fdopen(write_fd, "w") as pipe:
                    write_fd = -1
                    pipe.write(self.url)
            finally:
                os.close(read_fd)
                if write_fd >= 0:
                    os.close(write_fd)

    def _launch(self, args: list[str], env: dict[str, str], read_fd: int) -> WorkerProcess:
        """One worker reading the URL from `read_fd`: forked from the server where there is one, else a fresh one."""
        if self.server is not None and not self.gpus:
            try:
                return self.server.spawn(
                    args,
                    env,
                    1,  # this process's own stdout and stderr, as a fresh worker inherits them
                    read_fd,
                    module=forkserver.WORKER_MODULE,
                    err_fd=2,
                    keep_env=STORAGE_FD_ENV,
                    client=True,
                )
            except forkserver.ServerGone as exc:
                forkserver.log.warning("%s; the workers are fresh interpreters", exc)
                forkserver.forget(self.server)
                self.server = None
        cmd = [*forkserver.command(args, forkserver.WORKER_MODULE), "--storage-fd", str(read_fd)]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, pass_fds=(read_fd,))

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
