"""The README is the front page on the code host: its links into the guide must lead somewhere.

The guide's own links are checked by `mkdocs build --strict` (tests/run.sh); the README is
outside the site, so it is checked here.
"""

from __future__ import annotations

import re

from ..support.processes import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    links = LINK.findall((ROOT / "README.md").read_text())
    relative = [link.split("#")[0] for link in links if "://" not in link and not link.startswith("#")]
    assert relative, "the README links into the guide"
    missing = [link for link in relative if not (ROOT / link).is_file()]
    assert missing == []
