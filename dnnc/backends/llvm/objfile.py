"""Checks on an object file before LLVM loads it.

LLVM's object loader (RuntimeDyld, behind `add_object_file`) trusts its input: a truncated
file, offsets past the end or a relocation naming a symbol that does not exist crash the
process, and a symbol it cannot resolve is left as address 0 for the code to jump to.
`check_object` refuses, with an `ArtifactError`, a file that is not an object for this
machine's architecture or whose ELF tables point outside it, and returns the symbols it needs
from the process, for the loader to look up first; what the code does once it is loaded is
beyond any such check (docs/artifacts.md).

ELF (Linux, the BSDs) is checked in full: header, section table, symbol tables and
relocations. Mach-O and COFF objects are only checked for their magic and machine.
"""

from __future__ import annotations

import struct
import sys

import llvmlite.binding as llvm
import numpy as np

from ...errors import ArtifactError

# architecture (the triple's first part) -> ELF e_machine, Mach-O cputype, COFF machine
_MACHINES = {
    "x86_64": (62, 0x01000007, 0x8664),
    "aarch64": (183, 0x0100000C, 0xAA64),
    "arm64": (183, 0x0100000C, 0xAA64),
    "riscv64": (243, None, None),
    "ppc64le": (21, None, None),
    "s390x": (22, None, None),
}

_ELF_HEADER = "16sHHIQQQIHHHHHH"  # ELF64: e_ident, e_type ... e_shstrndx
_SHT_NULL, _SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 0, 2, 3, 4, 8, 9
_SECTION = [("name", "u4"), ("type", "u4"), ("flags", "u8"), ("addr", "u8"),
            ("offset", "u8"), ("size", "u8"), ("link", "u4"), ("info", "u4"),
            ("addralign", "u8"), ("entsize", "u8")]
_SYMBOL = [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2"),
           ("value", "u8"), ("size", "u8")]
_RELA = [("offset", "u8"), ("info", "u8"), ("addend", "i8")]
_REL = [("offset", "u8"), ("info", "u8")]
_SHN_LORESERVE = 0xFF00
_STB_WEAK = 2


def check_object(data: bytes) -> list[str]:
    """Raise ArtifactError unless `data` is a well-formed object for this architecture;
    return the names of the (non-weak) symbols it leaves undefined (ELF only: [] for other
    formats)."""
    arch = llvm.get_process_triple().split("-")[0]
    elf, macho, coff = _MACHINES.get(arch, (None, None, None))
    if data[:4] == b"\x7fELF":
        return _check_elf(data, arch, elf)
    elif data[:4] in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"):
        order = "<" if data[:1] == b"\xcf" else ">"
        if len(data) < 32 or struct.unpack_from(order + "i", data, 4)[0] != macho:
            raise ArtifactError(f"object code is a Mach-O file for another CPU than {arch}")
    elif coff is not None and len(data) >= 20 and struct.unpack_from("<H", data)[0] == coff:
        pass
    else:
        raise ArtifactError(f"object code is not an object file for {arch} "
                            f"(starts with {data[:4].hex()})")
    return []


def _check_elf(data: bytes, arch: str, machine: int | None) -> list[str]:
    if len(data) < 64:
        raise ArtifactError(f"object code truncated: {len(data)} bytes")
    if data[4] != 2:
        raise ArtifactError("object code is a 32-bit ELF file")
    order = {1: "<", 2: ">"}.get(data[5])
    if order != ("<" if sys.byteorder == "little" else ">"):
        raise ArtifactError("object code is an ELF file of another byte order")
    (_, e_type, e_machine, _, _, _, shoff, _, _, _, _, shentsize, shnum,
     shstrndx) = struct.unpack_from(order + _ELF_HEADER, data)
    if e_machine != machine:
        raise ArtifactError(f"object code is for ELF machine {e_machine}, this machine is "
                            f"{arch} ({machine})")
    if e_type != 1:
        raise ArtifactError(f"object code is an ELF file of type {e_type}, not a relocatable "
                            f"object")
    if shentsize != 64 or shnum == 0 or shstrndx >= shnum or \
            shoff > len(data) or shnum * 64 > len(data) - shoff:
        raise ArtifactError("object code's section table lies outside the file")
    sections = np.frombuffer(data, np.dtype(_SECTION).newbyteorder(order), shnum, shoff)

    def table(k: int, what: str) -> bytes:
        """The bytes of section k, checked to lie inside the file."""
        s = sections[k]
        offset, size = int(s["offset"]), int(s["size"])
        if offset > len(data) or size > len(data) - offset:
            raise ArtifactError(f"object code's {what} (section {k}) lies outside the file")
        return data[offset:offset + size]

    names = table(shstrndx, "section names")
    undefined: list[str] = []
    for k, s in enumerate(sections):
        kind = int(s["type"])
        align = int(s["addralign"])
        if int(s["name"]) >= max(len(names), 1) or int(s["link"]) >= shnum or \
                align & (align - 1):
            raise ArtifactError(f"object code's section {k} is malformed")
        if kind not in (_SHT_NULL, _SHT_NOBITS):
            table(k, "section")
        if kind == _SHT_SYMTAB:
            undefined += _check_symbols(table(k, "symbol table"), s, sections, order, k,
                                        table(int(s["link"]), "symbol names"))
        elif kind in (_SHT_RELA, _SHT_REL):
            _check_relocations(table(k, "relocations"), s, sections, order, k)
    return undefined


def _check_symbols(body: bytes, s, sections, order: str, k: int, names: bytes
                   ) -> list[str]:
    if int(s["entsize"]) != 24 or len(body) % 24 or \
            int(sections[int(s["link"])]["type"]) != _SHT_STRTAB:
        raise ArtifactError(f"object code's symbol table (section {k}) is malformed")
    symbols = np.frombuffer(body, np.dtype(_SYMBOL).newbyteorder(order))
    shndx = symbols["shndx"].astype(np.int64)
    if np.any(symbols["name"] >= max(len(names), 1)) or \
            np.any((shndx >= len(sections)) & (shndx < _SHN_LORESERVE)):
        raise ArtifactError(f"object code's symbol table (section {k}) points outside the "
                            f"file")
    needed = symbols[(shndx == 0) & (symbols["name"] > 0) & (symbols["info"] >> 4 != _STB_WEAK)]
    return [names[n:names.find(b"\0", n)].decode("ascii", "replace") for n in needed["name"]]


def _check_relocations(body: bytes, s, sections, order: str, k: int) -> None:
    rela = int(s["type"]) == _SHT_RELA
    size = 24 if rela else 16
    link, target = int(s["link"]), int(s["info"])
    if int(s["entsize"]) != size or len(body) % size or target >= len(sections) or \
            int(sections[link]["type"]) != _SHT_SYMTAB:
        raise ArtifactError(f"object code's relocations (section {k}) are malformed")
    entries = np.frombuffer(body, np.dtype(_RELA if rela else _REL).newbyteorder(order))
    n_symbols = int(sections[link]["size"]) // 24
    # coarse: each patched field must start inside its section
    if np.any((entries["info"] >> np.uint64(32)) >= n_symbols) or \
            np.any(entries["offset"] > max(int(sections[target]["size"]) - 1, 0)):
        raise ArtifactError(f"object code's relocations (section {k}) point outside their "
                            f"section or symbol table")
