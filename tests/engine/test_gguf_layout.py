"""The GGUF layout check a llama.cpp entry passes at registration (`core.gguf`): whole
files pass, text files and files cut short anywhere are refused, naming what is wrong."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from core.errors import InvalidInput
from core.gguf import layout_problem
from core.model_files import check_gguf_layout, default_model_source

UINT32, STRING, ARRAY, Q4_1 = 4, 8, 9, 3
Pair = tuple[bytes, int, bytes]
Tensor = tuple[bytes, Sequence[int], int, int]


def string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def gguf(pairs: Sequence[Pair] = (), tensors: Sequence[Tensor] = (), data: bytes = b"", *,
         version: int = 3, alignment: int = 32) -> bytes:
    """A GGUF file as the format lays it out: header, metadata, tensor table, padding to
    the data's alignment, data."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(pairs))
    for key, kind, value in pairs:
        head += string(key) + struct.pack("<I", kind) + value
    for name, shape, kind, offset in tensors:
        head += (string(name) + struct.pack(f"<I{len(shape)}Q", len(shape), *shape)
                 + struct.pack("<IQ", kind, offset))
    return head + bytes(-len(head) % alignment) + data


VOCABULARY: Pair = (b"tokenizer.ggml.tokens", ARRAY,
                    struct.pack("<IQ", STRING, 3) + string(b"a") + string(b"bc") + string(b""))
ALIGNED_64: Pair = (b"general.alignment", UINT32, struct.pack("<I", 64))
# 64 elements of Q4_1 are two blocks of 20 bytes.
SMALL_MODEL = gguf([VOCABULARY, ALIGNED_64], [(b"w", (64, 1), Q4_1, 0)], bytes(40), alignment=64)


def problem_of(data: bytes, tmp_path: Path) -> str | None:
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return layout_problem(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def bundled() -> bytes:
    return default_model_source().read_bytes()


def test_the_bundled_model_has_a_whole_layout(bundled: bytes, tmp_path: Path) -> None:
    assert problem_of(bundled, tmp_path) is None


@pytest.mark.parametrize(("keep", "part"), [
    (10, "its header is cut short"),
    (1_000_000, "its metadata is cut short"),  # inside the vocabulary
    (1_780_000, "its tensor table is cut short"),
    (30_000_000, "its tensor data is cut short (the file ends before its last tensor)"),
    (-1, "its tensor data is cut short (the file ends before its last tensor)"),
])
def test_the_bundled_model_cut_short_is_refused_naming_where(
    bundled: bytes, tmp_path: Path, keep: int, part: str
) -> None:
    assert problem_of(bundled[:keep], tmp_path) == part


def test_a_text_file_is_not_gguf(tmp_path: Path) -> None:
    assert problem_of(b"hello not a gguf\n", tmp_path) == (
        "it does not start with the GGUF magic bytes")


@pytest.mark.parametrize("version", [1, 4, 3 << 24])  # 3 << 24: a big-endian file
def test_a_version_llama_cpp_does_not_read_is_refused(tmp_path: Path, version: int) -> None:
    assert problem_of(gguf(version=version), tmp_path) == (
        f"its GGUF version {version} is not one llama.cpp reads (2 or 3)")


def test_counts_the_file_cannot_hold_are_refused_before_any_walk(tmp_path: Path) -> None:
    header = b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 0) + bytes(1000)

    assert problem_of(header, tmp_path) == "its header counts more entries than the file can hold"


def test_a_small_whole_file_passes_and_one_byte_less_is_cut_short(tmp_path: Path) -> None:
    header_alone = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)  # no metadata, no tensors
    assert problem_of(header_alone, tmp_path) is None
    assert problem_of(SMALL_MODEL, tmp_path) is None
    assert problem_of(SMALL_MODEL[:-1], tmp_path) == (
        "its tensor data is cut short (the file ends before its last tensor)")


@pytest.mark.parametrize(("pairs", "tensors", "problem"), [
    ([(b"general.alignment", UINT32, struct.pack("<I", 48))], [],
     "its general.alignment is not a power of two"),
    ([(b"x", 13, b"\0")], [], "its metadata holds a value of an unknown type"),
    ([(b"x", ARRAY, struct.pack("<IQ", ARRAY, 0))], [],
     "its metadata holds an array of an unknown type"),
    ([(b"x", ARRAY, struct.pack("<IQ", STRING, 1 << 40))], [], "its metadata is cut short"),
    ([], [(b"w", (1, 1, 1, 1, 1), 0, 0)], "a tensor has more than 4 dimensions"),
    ([], [(b"w", (48,), Q4_1, 0)], "a tensor's rows are not whole blocks of its type"),
    ([], [(b"w", (1,), 0, 8)], "a tensor's data is not aligned"),
])
def test_a_malformed_layout_is_refused_naming_the_fault(
    tmp_path: Path, pairs: list[Pair], tensors: list[Tensor], problem: str
) -> None:
    assert problem_of(gguf(pairs, tensors, bytes(4096)), tmp_path) == problem


def test_the_refusal_is_model_file_invalid_and_names_the_path_as_given(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello not a gguf\n")

    with pytest.raises(InvalidInput) as caught:
        check_gguf_layout(path, "notes.gguf")

    assert (caught.value.code, caught.value.extra) == ("model_file_invalid", {"field": "path"})
    assert caught.value.message == (
        "the model file 'notes.gguf' is not a GGUF model llama.cpp can load: "
        "it does not start with the GGUF magic bytes")
