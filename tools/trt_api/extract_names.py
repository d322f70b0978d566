"""Extract the Python names a compiled TensorRT bindings module registers, without importing it.

The TensorRT Python bindings (`tensorrt_bindings/tensorrt.so`, `tensorrt_rtx_bindings/tensorrt_rtx.so`)
are pybind11 extension modules that cannot be imported without the native TensorRT libraries. Their
names are still in the file: pybind11 registers every class, method, property and enum member with a
C string literal. This script reads them two ways:

* **Bare names**: every identifier-shaped, NUL-terminated string in `.rodata`. A name TensorRT
  registers is always among them; so are argument names and a few unrelated identifiers.
* **Qualified names** (`Owner.member`): from the disassembly (`objdump -d -C`), a name is attributed
  to the class whose pybind11 registration uses it. Evidence, in a `tensorrt::bind*(pybind11::module_&)`
  body, for identifier strings loaded since the last attribution:
  1. a reference to a `pybind11::cpp_function::initialize<...>` whose callable takes an `X&`/`X*`
     (the method being bound belongs to X);
  2. a call of `pybind11::class_<X>::def*` / `pybind11::enum_<X>::value`; the class of a cpp_function
     made just before wins over X, because identical-code folding can name another class's copy;
  3. `:ivar name:` lines of a class docstring attributed in the same way name X's properties;
  and identifier strings loaded inside a registration function specialised for X (a clone where the
  compiler propagated the name constant) belong to X.
  This is a heuristic. It misses a name the compiler loaded once and reused; it also attributes
  argument names (e.g. `pool`) to the class of the method that takes them, and now and then a member
  to a second, wrong class (seen: `IErrorRecorder.all_build_routes` beside the right
  `IBuilderConfig.all_build_routes`). So a qualified line is evidence, not proof; both of its parts
  are always real strings of the module. Owners are Python names: the C++ name after its namespaces, with the
  few documented renames in ALIASES (IBuilder -> Builder, IRuntime -> Runtime, IParser -> OnnxParser).

Usage: python tools/trt_api/extract_names.py WHEEL_OR_SO OUT.txt   (needs `objdump` from binutils)
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
IVAR = re.compile(r":ivar (\w+):")
BIND_FN = re.compile(r"tensorrt::bind\w*\(pybind11::module_&\)( \[clone [^\]]*\])*")
OWNER_FN = re.compile(r"pybind11::(class_|enum_)<")
LEA = re.compile(r"\blea\s+0x[0-9a-f]+\(%rip\),%\w+\s+# ([0-9a-f]+)(?: <(.*)>)?\s*$")
CALL = re.compile(r"\b(?:call|jmp)\s+[0-9a-f]+ <(.*)>\s*$")
SELF_ARG = re.compile(r"\{lambda\(((?:const )?[\w:]+)(?: const)?[&*]")
# C++ types whose Python name is not their last C++ name component (TensorRT's documented Python names).
ALIASES = {
    "IBuilder": "Builder", "IRuntime": "Runtime", "IParser": "OnnxParser", "IParserError": "ParserError",
    "IParserRefitter": "OnnxParserRefitter", "IRefitter": "Refitter", "DefaultLogger": "Logger",
    "IKernelLaunchParams": "KernelLaunchParams",
}
NAMESPACES = {"nvinfer1", "nvonnxparser", "v_1_0", "v_2_0", "tensorrt"}


def read_module(path: Path) -> tuple[bytes, str, str]:
    """(extension module bytes, __init__.py text, a label) from a bindings wheel or a bare .so file."""
    if path.suffix == ".so":
        return path.read_bytes(), "", path.name
    with zipfile.ZipFile(path) as z:
        so = [n for n in z.namelist() if n.endswith(".so") and "_bindings/" in n]
        if len(so) != 1:
            raise SystemExit(f"{path.name}: expected one *_bindings/*.so, found {so}")
        init = so[0].rsplit("/", 1)[0] + "/__init__.py"
        return z.read(so[0]), z.read(init).decode() if init in z.namelist() else "", path.name


def section(elf: bytes, name: str) -> tuple[int, int, int]:
    """(virtual address, file offset, size) of an ELF64 section."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    def header(i: int) -> tuple[int, int, int, int]:
        name_off, _, _, addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        return name_off, addr, off, size
    _, _, strtab, _ = header(shstrndx)
    for i in range(shnum):
        name_off, addr, off, size = header(i)
        end = elf.index(b"\0", strtab + name_off)
        if elf[strtab + name_off:end].decode() == name:
            return addr, off, size
    raise SystemExit(f"no {name} section")


class Strings:
    """C strings of `.rodata`, looked up by virtual address (a reference may point into a merged tail)."""

    def __init__(self, elf: bytes) -> None:
        self.elf = elf
        self.addr, self.off, self.size = section(elf, ".rodata")

    def at(self, addr: int) -> str | None:
        """The printable C string starting at `addr`, or None."""
        if not self.addr <= addr < self.addr + self.size:
            return None
        start = addr - self.addr + self.off
        end = self.elf.find(b"\0", start, self.off + self.size)
        raw = self.elf[start:end]
        if not raw or any(b < 9 or 13 < b < 32 or b > 126 for b in raw):
            return None
        return raw.decode()

    def identifiers(self) -> set[str]:
        """Every identifier-shaped NUL-terminated string of the section."""
        body = self.elf[self.off:self.off + self.size]
        return {m.group().decode() for m in re.finditer(rb"(?<=\x00)[A-Za-z_][A-Za-z0-9_]*(?=\x00)", body)}


def first_template_arg(text: str, opening: str) -> str:
    """The first template argument after `opening` (which ends with '<')."""
    i = j = text.index(opening) + len(opening)
    depth = 1
    while j < len(text):
        c = text[j]
        depth += (c == "<") - (c == ">")
        if depth == 0 or (c == "," and depth == 1):
            break
        j += 1
    return text[i:j].strip()


def python_owner(cpp_type: str) -> str:
    """The Python name of a bound C++ type: its components after the namespaces, aliases applied."""
    parts = [p for p in re.split(r"::(?![^<]*>)", re.sub(r"\(.*?\)", "", cpp_type)) if p and p not in NAMESPACES]
    parts = [ALIASES.get(p, p) for p in parts if not p.startswith("bind")]
    return ".".join(parts)


def registration_owner(symbol: str) -> str | None:
    """The bound C++ type when `symbol` is a pybind11 class_/enum_ registration function."""
    m = OWNER_FN.match(symbol)
    return first_template_arg(symbol, m.group(0)) if m else None


def attribute(lines: list[str], strings: Strings) -> tuple[dict[str, set[str]], set[str]]:
    """(owner Python name -> member names, every identifier string referenced by code)."""
    members: dict[str, set[str]] = defaultdict(set)
    referenced: set[str] = set()
    context: str | None = None  # "bind" or "clone"
    clone_owner: str | None = None
    pending: list[str] = []
    docs: list[str] = []  # class docstrings survive the internal calls of an inlined class_ constructor

    def give(owner_cpp: str, names: list[str]) -> None:
        owner = python_owner(owner_cpp)
        for n in names:
            if ":ivar " in n:
                members[owner].update(IVAR.findall(n))
            elif IDENT.fullmatch(n) and not n.startswith(("_", "pybind11_")) and n != owner.rsplit(".", 1)[-1]:
                members[owner].add(n)

    last_self: str | None = None  # the class whose method a just-made cpp_function binds
    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith(">:"):
            symbol = line[line.index("<") + 1:line.rstrip().rindex(">")]
            clone_owner = registration_owner(symbol)
            context = "bind" if BIND_FN.fullmatch(symbol) else "clone" if clone_owner else None
            pending, docs, last_self = [], [], None
            continue
        lea = LEA.search(line)
        text = strings.at(int(lea.group(1), 16)) if lea else None
        if text is not None and IDENT.fullmatch(text):
            referenced.add(text)  # merged string tails ("Builder" inside "IBuilder") start after no NUL
        if context == "clone" and clone_owner and text is not None:
            give(clone_owner, [text])
        elif context == "bind" and text is not None:
            (pending if IDENT.fullmatch(text) else docs).append(text)
        elif context == "bind" and lea and lea.group(2) and "cpp_function::initialize<" in lea.group(2):
            self_arg = SELF_ARG.search(lea.group(2))
            if self_arg:
                last_self = self_arg.group(1).removeprefix("const ")
                give(last_self, pending)
                pending = []
        elif context == "bind" and (call := CALL.search(line)):
            reg = registration_owner(call.group(1))
            if reg:
                # Identical-code folding can name another class's copy of a registration function, so
                # the class of the cpp_function just made wins over the call target's class.
                give(last_self or reg, pending + docs)
                pending, docs, last_self = [], [], None
    return members, referenced


def disassemble(module: bytes) -> list[str]:
    """`objdump -d -C` of the module, as lines."""
    if not shutil.which("objdump"):
        raise SystemExit("objdump (binutils) is needed to read the bindings' disassembly")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(module)
        f.flush()
        out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", f.name], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def extract(path: Path) -> tuple[list[str], str]:
    """(sorted name lines, header comment) for the bindings at `path`."""
    module, init, label = read_module(path)
    strings = Strings(module)
    members, referenced = attribute(disassemble(module), strings)
    bare = strings.identifiers() | referenced
    bare.update(a or b for a, b in re.findall(r"^(?:def (\w+)|(\w+) = )", init, re.M))  # the package's own Python names
    qualified = {f"{owner}.{m}" for owner, names in members.items() if owner.split(".")[0] in bare for m in names if m in bare}
    header = (
        f"# Names registered by {label} (module sha256 {hashlib.sha256(module).hexdigest()[:16]}),\n"
        "# read by tools/trt_api/extract_names.py without importing it. A bare line is an identifier string\n"
        "# of the module; an Owner.member line says the disassembly attributes `member` to `Owner`'s\n"
        "# pybind11 registration (see the script's docstring for how strict that is).\n"
    )
    return sorted(bare | qualified), header


def main(argv: list[str]) -> int:
    """Write the name list of the wheel (or .so) argv[0] to argv[1]."""
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    names, header = extract(Path(argv[0]))
    Path(argv[1]).write_text(header + "\n".join(names) + "\n")
    print(f"{argv[1]}: {len(names)} names ({sum('.' in n for n in names)} qualified)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
