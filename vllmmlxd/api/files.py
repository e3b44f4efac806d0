"""Files sent inline in a request (Responses' ``input_file`` part, chat completions' ``file``
part): their bytes, from ``file_data`` (a ``data:`` URL or bare base64), become text the model
reads: a PDF's extracted text (pypdf), a text file's own. There is no Files API, so ``file_id``
and ``file_url`` are refused by name; a file of an unknown type, one with no text, or one that
cannot be read is a 400 saying why. Pure; PDF extraction is CPU work, so callers run it off the
event loop."""

from __future__ import annotations

import base64
import binascii
import io
import logging
import re
from pathlib import PurePosixPath
from typing import Any

from ..errors import InvalidRequest

# Text types read as UTF-8, by media type or by the file name's suffix.
TEXT_TYPES = frozenset({"application/json", "application/xml", "application/x-yaml", "application/yaml"})
TEXT_SUFFIXES = frozenset(
    [
        ".txt",
        ".md",
        ".markdown",
        ".rst",
        ".csv",
        ".tsv",
        ".json",
        ".jsonl",
        ".yaml",
        ".yml",
        ".toml",
        ".xml",
        ".html",
        ".htm",
        ".log",
        ".ini",
        ".cfg",
        ".py",
        ".js",
        ".ts",
        ".tsx",
        ".jsx",
        ".java",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".rs",
        ".go",
        ".rb",
        ".php",
        ".sh",
        ".swift",
        ".kt",
        ".sql",
        ".css",
        ".tex",
    ]
)
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[\w-]+=[^;,]*)*(?P<b64>;base64)?,", re.A)
# pypdf logs a malformed file's every repair at warning level: the 400 says what matters.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def file_text(part: dict[str, Any], where: str, data_key: str = "file_data") -> str:
    """The text of one inline file part (``where`` names it in errors), headed by its name."""
    for key in ("file_id", "file_url"):
        if part.get(key):
            raise InvalidRequest(
                f"{where}.{key}: this server has no Files API; send the file inline as {data_key} "
                "(a data: URL or base64)",
                param=f"{where}.{key}",
            )
    data = part.get(data_key)
    if not isinstance(data, str) or not data:
        raise InvalidRequest(f"{where}.{data_key} must be the file's content (a data: URL or base64)", param=where)
    name = part.get("filename") if isinstance(part.get("filename"), str) else None
    media, raw = _decoded(data, f"{where}.{data_key}")
    text = _text_of(raw, media, name, f"{where}.{data_key}")
    if not text.strip():
        raise InvalidRequest(
            f"{where}: the file has no text to read (a scanned PDF holds only images)", param=f"{where}.{data_key}"
        )
    return f"\n[file: {name or 'unnamed'}]\n{text.strip()}\n[end of file]\n"


def _decoded(data: str, where: str) -> tuple[str | None, bytes]:
    media, body = None, data
    found = DATA_URL.match(data)
    if found:
        media, body = found.group("type"), data[found.end() :]
        if not found.group("b64"):
            return media, body.encode()
    try:
        return media, base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where} is not valid base64", param=where) from None


def _text_of(raw: bytes, media: str | None, name: str | None, where: str) -> str:
    suffix = PurePosixPath(name).suffix.lower() if name else ""
    if media == "application/pdf" or suffix == ".pdf" or (media is None and raw.startswith(b"%PDF-")):
        return pdf_text(raw, where)
    if (media or "").startswith("text/") or media in TEXT_TYPES or suffix in TEXT_SUFFIXES:
        try:
            return raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{where}: a text file must be UTF-8", param=where) from None
    raise InvalidRequest(
        f"{where}: files of type {media or suffix or 'unknown'!r} are not supported; send a PDF or a text file "
        "(with its media type in the data: URL, or a filename with its suffix)",
        param=where,
    )


def pdf_text(raw: bytes, where: str) -> str:
    """A PDF's text, page after page (pypdf); an encrypted or unreadable file is a 400."""
    from pypdf import PdfReader  # imported on first use: most workers never read a PDF
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and not reader.decrypt(""):
            raise InvalidRequest(f"{where}: the PDF is encrypted", param=where)
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except InvalidRequest:
        raise
    except PdfReadError as exc:
        raise InvalidRequest(f"{where}: the PDF cannot be read ({exc})"[:300], param=where) from None
    except Exception as exc:  # a malformed file trips pypdf in many ways: the client's file, never a 500
        raise InvalidRequest(f"{where}: the PDF cannot be read ({type(exc).__name__})", param=where) from None
