"""Reading a file that another process is still writing, line by line, read-only.

A trainer appends to its log while we read it, so the last line may be incomplete:
it is held back until its newline arrives. A file that shrinks was truncated (read it
again from the start); a file whose inode changed was rotated (finish the old one, then
start the new one). The file is only ever opened for reading.
"""

from __future__ import annotations

import os
from pathlib import Path

READ_CHUNK = 1 << 20


class LineTail:
    """Yields complete lines appended to ``path`` since the last call."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.line_number = 0  # lines handed out so far (1-based numbers for messages)
        self.truncations = 0
        self.rotations = 0
        self._inode: tuple[int, int] | None = None

    def read_bytes(self) -> bytes:
        """The bytes appended since the last call (after a truncation or rotation: the new
        file's from its start; ``resets`` counts those, so a caller can drop held state)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return b""
        inode = (st.st_dev, st.st_ino)
        if self._inode is not None and inode != self._inode:
            # Rotated: the old file is gone or renamed; what it still held unread is lost.
            self.rotations += 1
            self._reset()
        elif st.st_size < self.offset:
            self.truncations += 1
            self._reset()
        self._inode = inode
        if st.st_size == self.offset:
            return b""
        chunks = []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while True:
                chunk = fh.read(READ_CHUNK)
                if not chunk:
                    break
                self.offset += len(chunk)
                chunks.append(chunk)
        return b"".join(chunks)

    @property
    def resets(self) -> int:
        return self.truncations + self.rotations

    def read_lines(self) -> list[bytes]:
        """Complete lines (without the newline) that arrived since the last call."""
        data = self.read_bytes()
        if not data:
            return []
        parts = (self.partial + data).split(b"\n")
        self.partial = parts.pop()
        self.line_number += len(parts)
        return parts

    def take_partial(self) -> bytes:
        """The incomplete last line, given up (at the end of a read, when no more will come)."""
        partial, self.partial = self.partial, b""
        if partial:
            self.line_number += 1
        return partial

    def _reset(self) -> None:
        self.offset = 0
        self.partial = b""
        self.line_number = 0
