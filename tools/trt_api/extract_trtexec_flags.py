"""List the command-line flags trtexec parses, from its option parser's source (`samples/common/sampleOptions.cpp`).

trtexec is not installable here (the PyPI wheels ship the bindings and libraries, not trtexec), so the
export's trtexec lines are checked against the flags its own parser names: every `"--flag"` string
literal of NVIDIA/TensorRT's open-source `samples/common/sampleOptions.cpp` (the parsing calls
`getAndDelOption(arguments, "--flag", ...)` and the help text).

Usage: python tools/trt_api/extract_trtexec_flags.py sampleOptions.cpp VERSION OUT.txt
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

FLAG = re.compile(r'"(--[A-Za-z][A-Za-z0-9]*)"')


def flags(source: str) -> list[str]:
    """Every `"--flag"` literal of the source, sorted, once each."""
    return sorted(set(FLAG.findall(source)))


def main(argv: list[str]) -> int:
    source, version, out = Path(argv[0]), argv[1], Path(argv[2])
    text = source.read_text()
    header = (f"# trtexec flags of TensorRT {version}: every \"--flag\" literal of samples/common/sampleOptions.cpp "
              f"(sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}),\n# read by tools/trt_api/extract_trtexec_flags.py.\n")
    out.write_text(header + "\n".join(flags(text)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
