"""A process that takes a device lock on command, for the cross-process lock tests.

`python -m tests.lockproc DEVICE LOCK_DIR` reads lines from stdin: `shared` or `exclusive` takes the
lock (and prints `held <mode>` once it has it), `release` lets go (and prints `released`), EOF exits.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

from tuner.measure.exclusive import DeviceLock


def main(device: str, directory: str) -> None:
    lock = DeviceLock(device, Path(directory))
    stack = ExitStack()
    for line in sys.stdin:
        command = line.strip()
        if command in ("shared", "exclusive"):
            hold = stack.enter_context(lock.hold(command))
            print(f"held {command} {int(hold.exclusive)}", flush=True)
        elif command == "release":
            stack.close()
            print("released", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
