"""Inline files (Responses' input_file, chat's file part) as the text the model reads: a PDF's
extracted text, a text file's own; what cannot be read is a 400 naming the field and why."""

from __future__ import annotations

import base64

import pytest

from tests.support.pdf import text_pdf
from vllmmlxd.api.files import file_text
from vllmmlxd.errors import InvalidRequest


def data_url(raw: bytes, media: str) -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


def test_a_pdfs_pages_become_its_text_headed_by_its_name():
    part = {
        "filename": "report.pdf",
        "file_data": data_url(text_pdf("Quarterly report", "Page two"), "application/pdf"),
    }
    text = file_text(part, "input[0].content[1]")
    assert text == "\n[file: report.pdf]\nQuarterly report\n\nPage two\n[end of file]\n"
    bare = {"file_data": base64.b64encode(text_pdf("Bare")).decode()}  # no media type, no name: its magic says PDF
    assert "Bare" in file_text(bare, "f")


@pytest.mark.parametrize(
    "part",
    [
        {"filename": "notes.md", "file_data": base64.b64encode("# Título\nhello".encode()).decode()},
        {"file_data": data_url("# Título\nhello".encode(), "text/markdown")},
        {"filename": "notes.txt", "file_data": "data:text/plain,# Título\nhello"},
    ],
)
def test_text_files_are_read_as_utf8(part):
    assert "# Título\nhello" in file_text(part, "f")


@pytest.mark.parametrize(
    "part, param, words",
    [
        ({"file_id": "file-1"}, "f.file_id", "no Files API"),
        ({"file_url": "https://example.com/a.pdf"}, "f.file_url", "no Files API"),
        ({}, "f", "must be the file's content"),
        ({"file_data": "data:application/pdf;base64,!!!"}, "f.file_data", "not valid base64"),
        ({"file_data": data_url(b"\x89PNG...", "image/png")}, "f.file_data", "'image/png' are not supported"),
        ({"filename": "a.bin", "file_data": base64.b64encode(b"\x00\x01").decode()}, "f.file_data", "'.bin'"),
        ({"file_data": data_url(text_pdf(), "application/pdf")}, "f.file_data", "no text to read"),
        ({"file_data": data_url(b"%PDF-1.4 not really", "application/pdf")}, "f.file_data", "cannot be read"),
        ({"filename": "a.txt", "file_data": base64.b64encode(b"\xff\xfe\xfa").decode()}, "f.file_data", "UTF-8"),
    ],
)
def test_what_cannot_be_read_is_a_400_saying_why(part, param, words):
    with pytest.raises(InvalidRequest) as err:
        file_text(part, "f")
    assert err.value.param == param and words in err.value.message
