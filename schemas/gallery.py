"""The checkpoints of the gallery import: one parent run per album, one child run per photo."""

from __future__ import annotations

import msgspec


class Album(msgspec.Struct):
    """An album import: the photos to thumbnail, then what became of each."""

    album: str
    photos: list[str]
    thumbnails: dict[str, str] = {}
    broken: dict[str, str] = {}
    published: bool = False


class Thumbnail(msgspec.Struct):
    """One photo of an album, thumbnailed by its own child run."""

    album: str
    photo: str
    size: int | None = None
