"""The gateway's reading of upload forms (pure): the ``model`` field found in a multipart body as
httpx encodes one (the official SDK's client) and as a file-first form has it, never in a file part;
renamed in place, every other byte kept; the body limit from the routes' audio limits."""

from __future__ import annotations

import httpx
import pytest

from vllmmlxd.config.gateway import Route
from vllmmlxd.errors import InvalidRequest
from vllmmlxd.gateway.uploads import FORM_SLACK_BYTES, boundary_of, form_field, upload_limit, with_field

AUDIO = bytes(range(256)) * 64 + b'\r\nname="model"\r\n\r\nnot-this'  # binary, with a decoy inside the file


def encoded(data: dict, files: dict) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/v1/audio/transcriptions", data=data, files=files)
    return request.read(), request.headers["content-type"]


def test_the_model_field_of_an_sdk_form_is_found_and_the_file_is_not_read_as_one():
    body, content_type = encoded({"model": " whisper ", "language": "en"}, {"file": ("model", AUDIO, "audio/wav")})
    boundary = boundary_of(content_type)
    assert form_field(body, boundary, "model") == "whisper"
    assert form_field(body, boundary, "language") == "en"
    assert form_field(body, boundary, "prompt") is None


def test_a_field_after_the_file_is_found_too():
    boundary = b"XyZ"
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        + AUDIO
        + b'\r\n--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--XyZ--\r\n'
    )
    assert form_field(body, boundary, "model") == "whisper"


def test_renaming_the_model_keeps_every_other_byte():
    body, content_type = encoded({"model": "alias", "stream": "true"}, {"file": ("a.wav", AUDIO, "audio/wav")})
    boundary = boundary_of(content_type)
    renamed = with_field(body, boundary, "model", "served-name")
    assert renamed.replace(b"served-name", b"alias", 1) == body
    assert form_field(renamed, boundary, "model") == "served-name"
    assert with_field(body, boundary, "prompt", "x") == body  # an absent field: the body as it was


def test_a_body_that_is_no_multipart_form_is_a_400():
    with pytest.raises(InvalidRequest, match="multipart/form-data"):
        boundary_of("application/json")
    with pytest.raises(InvalidRequest, match="boundary"):
        boundary_of("multipart/form-data")
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"


def route(name: str, mb: float) -> Route:
    return Route(name=name, served_model_name=name, url="http://127.0.0.1:1", max_audio_mb=mb)


def test_the_upload_limit_is_the_largest_routes_audio_limit_or_the_gateways_body_limit():
    assert upload_limit((route("a", 25), route("b", 100)), 16) == 100 * 1024 * 1024 + FORM_SLACK_BYTES
    assert upload_limit((route("a", 25),), 64) == 64 * 1024 * 1024 + FORM_SLACK_BYTES
    assert upload_limit((), 16) == 25 * 1024 * 1024 + FORM_SLACK_BYTES


def test_a_form_read_as_the_parser_reads_it_not_as_it_looks():
    # A file whose bytes look like a part, a lower-case header and an unquoted name: only the real
    # model field is found, and only its value changes.
    body = (
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        b'RIFF\r\n--X\r\nContent-Disposition: form-data; name="model"\r\n\r\nfake\r\n'
        b"--XX\r\ncontent-disposition: form-data; name=model\r\n\r\nears\r\n--XX--\r\n"
    )
    assert form_field(body, b"XX", "model") == "ears"
    renamed = with_field(body, b"XX", "model", "whisper-1")
    assert renamed == body.replace(b"\r\n\r\nears\r\n", b"\r\n\r\nwhisper-1\r\n")
    assert form_field(b"--XX\r\nnot a form", b"XX", "model") is None
