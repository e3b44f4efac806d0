"""The browser gate and the upload routes: a program may post a multipart form to
/v1/audio/transcriptions and /v1/audio/translations; a page may only where it names an origin
the origin check let through; every other route still takes JSON alone."""

from __future__ import annotations

from starlette.datastructures import Headers

from vllmmlxd.http.browser import content_type_refusal

FORM = "multipart/form-data; boundary=x"


def test_a_program_may_post_a_form_to_the_upload_routes():
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        assert content_type_refusal("POST", Headers({"content-type": FORM}), path) is None


def test_a_page_may_only_with_an_origin_that_was_checked():
    page = {"content-type": FORM, "sec-fetch-mode": "cors", "sec-fetch-site": "cross-site"}
    assert content_type_refusal("POST", Headers(page), "/v1/audio/transcriptions") is not None
    with_origin = {**page, "origin": "http://allowed.example"}  # origin_refusal passed it before this gate
    assert content_type_refusal("POST", Headers(with_origin), "/v1/audio/transcriptions") is None


def test_other_routes_still_refuse_forms():
    assert content_type_refusal("POST", Headers({"content-type": FORM}), "/v1/chat/completions") is not None
    assert content_type_refusal("POST", Headers({"content-type": "text/plain"}), "/v1/audio/transcriptions")
