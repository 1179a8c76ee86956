"""The layout of a GGUF file (llama.cpp's model format), checked without loading it.

The registry refuses a file the llama.cpp engine could never load (a text file, a
download cut short) when it is registered; registered, it would fail every task on it
with `model_load_failed`. Read: the header, the metadata (walked; no value is read but
`general.alignment`), the tensor table; then the file must reach the end of its last
tensor's data, which llama.cpp checks at load too. No tensor data is read, so the cost
is the metadata's size (a few MB for a large vocabulary), never the model's.

A file that passes may still fail to load (an architecture this llama.cpp lacks, too
little memory): this catches mistakes, and the engine's load stays the judge. Format:
github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian; versions 2 and 3
are those llama.cpp reads).
"""

from __future__ import annotations

import math
import os
import struct

MAGIC = b"GGUF"
READABLE_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
HEADER_BYTES = 24  # magic, version, tensor count, metadata count
_ALIGNMENT_KEY = b"general.alignment"
# The smallest a metadata pair (key length, type, a one-byte value) and a tensor's entry
# (name length, dimension count, type, offset) can be: counts that would need more bytes
# than the file has are refused before anything is walked.
_MIN_PAIR_BYTES = 8 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
_WINDOW_BYTES = 1 << 20

# Metadata value types of a fixed size, by type number.
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_UINT32, _STRING, _ARRAY = 4, 8, 9
# ggml tensor type -> (elements per block, bytes per block): ggml's own table, for the
# types a GGUF file may hold. A type not listed (one newer than this table) has its
# data's start checked, not its end.
_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
    18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Broken(Exception):
    """Why the layout is unusable, in words fit for the operator."""


def layout_problem(fd: int, size: int) -> str | None:
    """Why the GGUF file open at `fd` (`size` bytes, as `fstat` gave) cannot be loaded,
    or None. Reads with `pread`, so the descriptor's position is left alone, and a file
    cut short meanwhile reads short (a mapping of it would fault instead)."""
    try:
        _check(_Reader(fd, size))
    except _Broken as exc:
        return str(exc)
    return None


class _Reader:
    """Little-endian numbers at absolute offsets, read through a window of the file."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._base = 0
        self._window = b""

    def at(self, pos: int, length: int, part: str) -> bytes:
        start = pos - self._base
        if start < 0 or start + length > len(self._window):
            self._load(pos, length, part)
            start = 0
        return self._window[start:start + length]

    def _load(self, pos: int, length: int, part: str) -> None:
        if pos + length > self.size:
            raise _Broken(f"its {part} is cut short")
        self._base = pos
        self._window = os.pread(self.fd, max(length, _WINDOW_BYTES), pos)
        if len(self._window) < length:
            raise _Broken(f"its {part} is cut short")

    def u32(self, pos: int, part: str) -> int:
        return int(_U32.unpack(self.at(pos, 4, part))[0])

    def u64(self, pos: int, part: str) -> int:
        return int(_U64.unpack(self.at(pos, 8, part))[0])

    def past_strings(self, pos: int, count: int, part: str) -> int:
        """The offset after `count` strings (each a length, then its bytes) at `pos`.
        One loop over the window: a vocabulary is an array of some 10^5 strings."""
        window, start = self._window, pos - self._base
        for _ in range(count):
            if start < 0 or start + 8 > len(window):
                self._load(pos, 8, part)
                window, start = self._window, 0
            length = _U64.unpack_from(window, start)[0]
            pos += 8 + length
            start += 8 + length
        if pos > self.size:
            raise _Broken(f"its {part} is cut short")
        return pos


def _check(reader: _Reader) -> None:
    if reader.size < len(MAGIC) or reader.at(0, len(MAGIC), "header") != MAGIC:
        raise _Broken("it does not start with the GGUF magic bytes")
    version = reader.u32(4, "header")
    if version not in READABLE_VERSIONS:
        raise _Broken(f"its GGUF version {version} is not one llama.cpp reads (2 or 3)")
    tensors, pairs = reader.u64(8, "header"), reader.u64(16, "header")
    if tensors * _MIN_TENSOR_BYTES + pairs * _MIN_PAIR_BYTES > reader.size - HEADER_BYTES:
        raise _Broken("its header counts more entries than the file can hold")
    pos, alignment = _past_metadata(reader, pairs)
    pos, data_bytes = _past_tensor_table(reader, pos, tensors, alignment)
    # No data, no padding before it either: a vocabulary-only file may end here.
    if data_bytes and -(-pos // alignment) * alignment + data_bytes > reader.size:
        raise _Broken("its tensor data is cut short (the file ends before its last tensor)")


def _past_metadata(reader: _Reader, pairs: int) -> tuple[int, int]:
    """The offset after the metadata pairs, and the data's alignment they set."""
    pos, alignment = HEADER_BYTES, DEFAULT_ALIGNMENT
    for _ in range(pairs):
        key_length = reader.u64(pos, "metadata")
        key_end = pos + 8 + key_length
        kind = reader.u32(key_end, "metadata")
        if key_length == len(_ALIGNMENT_KEY) and reader.at(
                pos + 8, key_length, "metadata") == _ALIGNMENT_KEY:
            alignment = reader.u32(key_end + 4, "metadata") if kind == _UINT32 else 0
            if alignment == 0 or alignment & (alignment - 1):
                raise _Broken("its general.alignment is not a power of two")
        pos = _past_value(reader, key_end + 4, kind)
    return pos, alignment


def _past_value(reader: _Reader, pos: int, kind: int) -> int:
    if kind in _FIXED_SIZES:
        end = pos + _FIXED_SIZES[kind]
    elif kind == _STRING:
        end = reader.past_strings(pos, 1, "metadata")
    elif kind == _ARRAY:
        item, count = reader.u32(pos, "metadata"), reader.u64(pos + 4, "metadata")
        pos += 12
        if item in _FIXED_SIZES:
            end = pos + count * _FIXED_SIZES[item]
        elif item == _STRING and count * 8 <= reader.size - pos:
            end = reader.past_strings(pos, count, "metadata")
        elif item == _STRING:
            raise _Broken("its metadata is cut short")
        else:
            raise _Broken("its metadata holds an array of an unknown type")
    else:
        raise _Broken("its metadata holds a value of an unknown type")
    if end > reader.size:
        raise _Broken("its metadata is cut short")
    return end


def _past_tensor_table(
    reader: _Reader, pos: int, tensors: int, alignment: int
) -> tuple[int, int]:
    """The offset after the tensor table, and how far past the data's start the
    tensors reach."""
    reach = 0
    for _ in range(tensors):
        pos = reader.past_strings(pos, 1, "tensor table")
        dims = reader.u32(pos, "tensor table")
        if dims > MAX_DIMS:
            raise _Broken(f"a tensor has more than {MAX_DIMS} dimensions")
        shape = struct.unpack(f"<{dims}Q", reader.at(pos + 4, 8 * dims, "tensor table"))
        pos += 4 + 8 * dims
        kind, offset = reader.u32(pos, "tensor table"), reader.u64(pos + 4, "tensor table")
        pos += 12
        if offset % alignment:
            raise _Broken("a tensor's data is not aligned")
        reach = max(reach, offset + _data_bytes(kind, shape))
    return pos, reach


def _data_bytes(kind: int, shape: tuple[int, ...]) -> int:
    """The bytes a tensor of ggml type `kind` and `shape` holds (0: a type not known)."""
    elements_per_block, block_bytes = _BLOCKS.get(kind, (0, 0))
    if not elements_per_block:
        return 0
    row = shape[0] if shape else 1
    if row % elements_per_block:
        raise _Broken("a tensor's rows are not whole blocks of its type")
    return row // elements_per_block * block_bytes * math.prod(shape[1:])
