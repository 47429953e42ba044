"""Where a dataset prefix names no files, the prefixes beside it that do (data.preprocess appends `_KEY_document`, as
Megatron-LM's tool does).
"""

from __future__ import annotations

import glob
import os


def complete(prefix: str) -> bool:
    return os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")


def prefixes_beside(prefix: str) -> list[str]:
    """The complete datasets (.bin and .idx) that `prefix` was probably meant to name, sorted."""
    found = []
    stem, extension = os.path.splitext(prefix)
    if extension in (".bin", ".idx") and complete(stem):
        found.append(stem)
    for index in glob.glob(glob.escape(prefix) + "_*.idx"):
        if complete(index[:-len(".idx")]):
            found.append(index[:-len(".idx")])
    return sorted(found)


def prefix_hint(prefix: str) -> str:
    """'; did you mean the prefix P?' (or one of several), or '' when nothing beside it is a dataset."""
    found = prefixes_beside(prefix)
    if not found:
        return ""
    named = repr(found[0]) if len(found) == 1 else "one of " + ", ".join(map(repr, found))
    return f"; did you mean the prefix {named}? (.bin and .idx exist there)"
