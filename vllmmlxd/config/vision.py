"""A vision model's image settings: how many, how large, fetched from where."""

from __future__ import annotations

from pydantic import Field

from .base import Strict
from .fields import Names


class VisionConfig(Strict):
    """The image limits of a vision entry (every one read per request: live)."""

    max_images: int = Field(16, ge=0, description="vision models: images per request at most, every turn counted")
    max_image_mb: float = Field(20.0, gt=0, description="vision models: an image's size at most (413 above)")
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="vision models: an image's width x height at most, before the model resizes it"
    )
    max_request_image_pixels: int = Field(
        100_000_000, ge=1, description="vision models: a request's images' width x height together at most (400 above)"
    )
    image_pixel_budget: int = Field(
        200_000_000,
        ge=1,
        description="vision models: decoded image pixels the worker holds at once, every request together (about 3 "
        "bytes each); a request waits for room, 503 after 30 s",
    )
    allow_image_urls: bool = Field(False, description="vision models: fetch http(s) image URLs; off: data only")
    allowed_image_hosts: Names = Field(
        (), description="hosts on loopback or private addresses that image URLs may be fetched from"
    )
    image_url_timeout: float = Field(10.0, gt=0, description="seconds an image URL's fetch may take")


# A vision entry's image settings: every one is read per request (config/diff.py: live).
IMAGE_FIELDS = tuple(VisionConfig.model_fields)
