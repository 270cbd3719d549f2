"""A file uploaded with a call, as a payload value: part of the pipeline's vocabulary, so a face can
build one (multipart routes) without knowing the skills that read it.

The pipeline hashes every payload with `json.dumps` (the ledger's request digest), which cannot take
bytes. So the mapping holds what identifies the file — name, content type, size, SHA-256 — and is what
the digest sees, while the bytes ride along as the `data` attribute.

What a skill reads from the bytes (an audio file's duration, an image's dimensions) is the skill's
business: it asks `measured(reader)`, which runs the reader once per file (validation and pricing both
ask) and keeps the answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class UploadedFile(dict[str, Any]):
    """A file uploaded with a call: a JSON-serialisable description, the bytes in `data`."""

    def __init__(self, data: bytes, filename: str = "file", content_type: str = "application/octet-stream"
                 ) -> None:
        super().__init__(filename=filename, content_type=content_type, bytes=len(data),
                         sha256=hashlib.sha256(data).hexdigest())
        self.data = data
        self._measures: dict[Callable[[bytes], Any], Any] = {}

    @property
    def filename(self) -> str:
        return str(self["filename"])

    @property
    def content_type(self) -> str:
        return str(self["content_type"])

    def measured(self, reader: Callable[[bytes], T]) -> T:
        """`reader(self.data)`, computed once per file and reader."""
        if reader not in self._measures:
            self._measures[reader] = reader(self.data)
        return self._measures[reader]  # type: ignore[no-any-return]
