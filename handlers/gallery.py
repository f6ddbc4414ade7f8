"""An album import as a parent machine with one child machine per photo.

``IMPORT`` starts a ``thumbnail`` run for every photo, committed with its
transition, and waits for all of them without holding a worker
(``Yield(children="all")``). When the last photo's run ends, the album's run
is woken once and reads every child's outcome: a photo whose run failed is
an outcome recorded in the album (``broken``), not a crash of the album.
"""

from __future__ import annotations

from eventbus.workflows import Machine, StepContext, Yield
from schemas import Album, Thumbnail

thumbnail = Machine("thumbnail", checkpoint=Thumbnail, key=lambda c: f"{c.album}/{c.photo}")


@thumbnail.state(initial=True, on_success="DONE", on_failure="FAILED")
async def RESIZE(c: Thumbnail, ctx: StepContext) -> None:
    if c.photo.endswith(".corrupt"):
        raise ValueError(f"{c.photo} is not an image")
    c.size = 64 * (1 + len(c.photo) % 3)  # a pretend resize: the thumbnail's size in pixels


thumbnail.terminal("DONE")

album = Machine("album", checkpoint=Album, key=lambda c: c.album)


@album.state(initial=True, on_success="PUBLISH", on_failure="FAILED", continue_run=False,
             children=thumbnail, max_visits=2)  # fmt: skip
async def IMPORT(c: Album, ctx: StepContext) -> Yield | None:
    if not ctx.children:  # the first visit: fan out, one child run per photo
        for photo in c.photos:
            ctx.start(thumbnail, Thumbnail(album=c.album, photo=photo))
        return Yield(children="all")
    for child in ctx.children:  # woken once, when the last one ended: fan in
        if child.ok:
            c.thumbnails[child.checkpoint.photo] = f"{child.checkpoint.size}px"
        else:
            c.broken[child.key.split("/", 1)[1]] = child.error or child.status or "?"
    return None


@album.state(on_success="DONE", on_failure="FAILED")
async def PUBLISH(c: Album, ctx: StepContext) -> None:
    c.published = bool(c.thumbnails)


album.terminal("DONE")
