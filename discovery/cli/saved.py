"""`toolreg call --save DIR`: the binary blocks of a result (images, audio, embedded files) written to files.

A terminal cannot show an image, and `--json` carries it as base64 a user
must decode by hand; `--save` writes each one under DIR, named for the tool
and the block's place in the answer, with the extension its MIME type (or the
resource's own name) gives, and the command prints the path where the block
would be.
"""

from __future__ import annotations

import base64
import mimetypes
from pathlib import Path
from typing import Any

from toolservice_base.schemas.content import AudioContent, ContentBlock, EmbeddedResource, ImageContent, render

from .common import CommandError


class Saver:
    """Writes the binary blocks of one call's answer under `directory`, numbering them in order."""

    def __init__(self, directory: Path, tool: str) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot write to --save {directory}: {exc.strerror}") from None
        self.directory = directory
        self.stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in tool)
        self.count = 0

    def save(self, block: ContentBlock) -> Path | None:
        """Write `block` if it holds bytes and return its path; None for text and links (nothing to write)."""
        data: bytes
        mime: str | None
        name: str | None = None
        if isinstance(block, ImageContent | AudioContent):
            data, mime = block.bytes, block.mime_type
        elif isinstance(block, EmbeddedResource) and (blob := block.resource.blob) is not None:
            contents = block.resource
            data, mime = base64.b64decode(blob), contents.mime_type
            name = contents.uri.rstrip("/").rpartition("/")[2] or None
        else:
            return None
        self.count += 1
        suffix = Path(name).suffix if name else (mimetypes.guess_extension(mime or "") or ".bin")
        path = self.directory / f"{self.stem}-{self.count}{suffix}"
        path.write_bytes(data)
        return path

    def said(self, block: ContentBlock) -> str:
        """What the terminal shows for `block`: its rendering, and the path it was written to."""
        path = self.save(block)
        return render(block) if path is None else f"{render(block)} saved to {path}"

    def wire(self, block: ContentBlock) -> dict[str, Any]:
        """`block` as `--json` prints it: its bytes replaced by the path they were written to."""
        path = self.save(block)
        body = block.to_wire()
        if path is None:
            return body
        if "resource" in body:
            body["resource"].pop("blob", None)
        body.pop("data", None)
        body["path"] = str(path)
        return body
