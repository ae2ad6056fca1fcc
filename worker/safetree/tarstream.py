"""The byte stream under a tar extraction: sniffed, decompressed, bounded, read to its end.

tarfile on its own is lenient where a pin must not be: a bad header in the middle of an
archive, or its data ending early, just ends iteration (the shortened archive looks
whole); its gzip reader checks neither the CRC nor what follows the compressed stream;
and it expands whatever it is given. Here:

- a format we do not read (zip, xz, bzip2, zstd, 7z, rar, lz4) is named as such
  (:func:`foreign_format`), not reported as a corrupt tar;
- gzip is inflated by zlib with its header and trailer checked (CRC-32 and length), and
  nothing may follow the compressed stream;
- the expanded stream is bounded (``max_bytes``: a compression-ratio bound the caller
  derives from the archive's size), so a small archive cannot be made to inflate for long;
- :class:`TarReader` records why tarfile stopped: only an end-of-archive marker (two zero
  blocks, then nothing but zero padding) ends an archive; a missing marker, an unreadable
  header or trailing data is refused (:func:`check_end`).
"""

from __future__ import annotations

import tarfile
import zlib
from typing import IO, Final, Self, cast

from worker.errors import ArchiveRefused
from worker.safetree.bounds import OverBound

CHUNK: Final = 1024 * 1024
BLOCK: Final = tarfile.BLOCKSIZE
_FOREIGN: Final = (
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bzip2"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
    (b"Rar!\x1a\x07", "rar"),
    (b"\x04\x22\x4d\x18", "lz4"),
)


def foreign_format(head: bytes) -> str | None:
    """The name of a format we do not read whose magic *head* starts with, else None."""
    return next((name for magic, name in _FOREIGN if head.startswith(magic)), None)


def corrupt(reason: str) -> ArchiveRefused:
    """A refusal of the archive as a whole (not one member)."""
    return ArchiveRefused(f"corrupt archive: {reason}", reason=f"corrupt archive: {reason}")


class Expanded:
    """A read-only stream of the tar bytes of *src* (inflated when ``compressed``),
    counting what it hands out and refusing more than ``max_bytes``."""

    __slots__ = ("expanded", "max_bytes", "src", "zlib")

    def __init__(self, src: IO[bytes], *, compressed: bool, max_bytes: int | None) -> None:
        self.src = src
        # wbits 16+15: a gzip member, header and trailer (CRC-32, length) checked by zlib.
        self.zlib = zlib.decompressobj(wbits=31) if compressed else None
        self.max_bytes = max_bytes
        self.expanded = 0

    def read(self, size: int = -1) -> bytes:
        """Up to *size* bytes (``-1``: a chunk); ``b""`` at the end.

        Raises:
            OverBound: more than ``max_bytes`` expanded.
            ArchiveRefused: the compressed stream is corrupt or ends early.
        """
        data = self._next(size if size > 0 else CHUNK)
        self.expanded += len(data)
        if self.max_bytes is not None and self.expanded > self.max_bytes:
            raise OverBound("bytes", self.max_bytes)
        return data

    def _next(self, size: int) -> bytes:
        inflate = self.zlib
        if inflate is None:
            return self.src.read(size)
        try:
            while not inflate.eof:
                if inflate.unconsumed_tail:
                    data = inflate.decompress(inflate.unconsumed_tail, size)
                else:
                    raw = self.src.read(CHUNK)
                    if not raw:
                        raise corrupt("the compressed stream ends early")
                    data = inflate.decompress(raw, size)
                if data:
                    return data
        except zlib.error as exc:
            raise corrupt(f"invalid compressed data ({exc})") from None
        return b""

    def finish(self) -> None:
        """After the tar's end: nothing may follow the compressed stream.

        Raises:
            ArchiveRefused: trailing data after the gzip stream.
        """
        if self.zlib is not None and (self.zlib.unused_data or self.src.read(1)):
            raise corrupt("data after the end of the compressed stream")


class TarInfo(tarfile.TarInfo):
    """Records on its :class:`TarReader` the header error that ended iteration."""

    @classmethod
    def fromtarfile(cls, tarfile: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile)
        except Exception as exc:
            if isinstance(tarfile, TarReader):
                tarfile.stopped_by = exc
            raise


class TarReader(tarfile.TarFile):
    """A tarfile that remembers why its iteration stopped (``stopped_by``)."""

    tarinfo = TarInfo
    stopped_by: Exception | None = None


def open_reader(stream: Expanded) -> TarReader:
    """A tarfile reading *stream* front to back (stream mode: no seek)."""
    reader = TarReader.open(fileobj=cast("IO[bytes]", stream), mode="r|", bufsize=CHUNK)
    assert isinstance(reader, TarReader)  # open is a classmethod of the subclass
    return reader


def check_end(tar: TarReader, stream: Expanded) -> None:
    """Call once iteration is over: the archive must have ended at a proper
    end-of-archive marker (two zero blocks), followed only by zero padding and, for
    gzip, the end of the compressed stream.

    Raises:
        ArchiveRefused: no end marker (truncated), an unreadable header, trailing data.
        OverBound: the padding takes the stream past its bound.
    """
    stopped = tar.stopped_by
    offset = tar.offset
    why = type(stopped).__name__  # tarfile's header errors (not in its typeshed stubs)
    if why == "EmptyHeaderError":
        raise corrupt(f"truncated: no end-of-archive marker after byte {offset}")
    if why == "TruncatedHeaderError":
        raise corrupt(f"truncated header at byte {offset}")
    if why != "EOFHeaderError":
        raise corrupt(f"unreadable header at byte {offset} ({stopped})")
    padding = 0
    fileobj = tar.fileobj
    assert fileobj is not None
    while chunk := fileobj.read(CHUNK):
        if chunk.count(0) != len(chunk):
            at = offset + BLOCK + padding + next(i for i, byte in enumerate(chunk) if byte)
            raise corrupt(f"data after the end-of-archive marker (byte {at})")
        padding += len(chunk)
    if padding < BLOCK:
        raise corrupt(f"truncated: one zero block at byte {offset}, the end marker is two")
    stream.finish()
