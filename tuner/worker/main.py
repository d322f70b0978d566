"""Entry point of one worker process: `python -m tuner.worker.main SPEC --storage-fd FD --budget N --index I`.

The storage URL is read from the inherited file descriptor FD (a pipe the pool writes it to; a worker
forked from the study's server finds its number in $TUNER_STORAGE_FD), so no password is ever on a
command line. The worker stops cleanly (SIGTERM) if its `tuner run` (or the server that forked it) dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from tuner.errors import TunerError
from tuner.spec import load_spec
from tuner.study.setup import Context, claim_device
from tuner.worker.lifeline import die_with_parent
from tuner.worker.loop import Stop, Worker
from tuner.worker.pool import STORAGE_FD_ENV


def read_url(fd: int) -> str:
    """The storage URL from the pipe `fd` (read to its end, then closed)."""
    with os.fdopen(fd, "r") as pipe:
        return pipe.read().strip()


def main(argv: list[str] | None = None) -> int:
    """Run one worker until the study's budget is used up or a signal stops it."""
    p = argparse.ArgumentParser(prog="tuner-worker")
    p.add_argument("spec")
    p.add_argument("--storage-fd", type=int, help=f"a pipe that holds the storage URL (else ${STORAGE_FD_ENV})")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"[worker {args.index}] %(levelname)s %(message)s")
    stop = Stop()
    stop.install()
    die_with_parent(signal.SIGTERM)
    url = read_url(args.storage_fd if args.storage_fd is not None else int(os.environ.pop(STORAGE_FD_ENV)))
    try:
        ctx = Context(load_spec(args.spec), url)
        claim_device(ctx)  # a study refuses a worker on other hardware (unless it may mix)
        worker = Worker(ctx, args.budget, args.index, stop)
        worker.run()
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
