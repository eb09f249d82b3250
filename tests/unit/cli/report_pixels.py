"""Reading a report back as a picture: the PNG inlined in its HTML, and where given colours appear."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
from matplotlib import image


def inlined_png(page: str) -> bytes:
    found = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert found, "the report inlines no PNG"
    return base64.b64decode(found.group(1))


def pixels_of(png: bytes, color: str, tolerance: float = 0.02) -> int:
    """How many pixels of the picture are `color` (#rrggbb)."""
    rgb = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    picture = image.imread(io.BytesIO(png), format="png")[..., :3]
    return int((np.abs(picture - rgb) < tolerance).all(axis=-1).sum())
