"""Entry point of one worker process: `python -m tuner.worker.main SPEC --storage URL --budget N --index I`."""

from __future__ import annotations

import argparse
import logging
import sys

from tuner.errors import TunerError
from tuner.spec import load_spec
from tuner.study.setup import Context
from tuner.worker.loop import Stop, Worker


def main(argv: list[str] | None = None) -> int:
    """Run one worker until the study's budget is used up or a signal stops it."""
    p = argparse.ArgumentParser(prog="tuner-worker")
    p.add_argument("spec")
    p.add_argument("--storage", required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"[worker {args.index}] %(levelname)s %(message)s")
    stop = Stop()
    stop.install()
    try:
        worker = Worker(Context(load_spec(args.spec), args.storage), args.budget, args.index, stop)
        worker.run()
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
