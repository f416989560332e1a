"""What goes into a request and comes out of a reply, as plain Python: a time window's stamps, the
evidence frames' pictures as arrays (docs/interfaces.md "Time windows and evidence", docs/show.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def to_time(value):
    """A ``since`` / ``until``: None or 0 (open), seconds (float, as the camera stamps), or a
    builtin_interfaces/Time as it is."""
    from builtin_interfaces.msg import Time  # noqa: PLC0415

    if value is None:
        return Time()
    if isinstance(value, Time):
        return value
    ns = int(round(float(value) * 1e9))
    if ns < 0:
        raise ValueError(f"a stamp must be >= 0, got {value}")
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def time_request(since=None, until=None, evidence_k: int = 0, with_images: bool = False) -> dict:
    """The Ask request's (and goal's) time fields (docs/interfaces.md "Time windows and evidence")."""
    return {"since": to_time(since), "until": to_time(until), "evidence_k": int(evidence_k),
            "with_images": bool(with_images)}


@dataclass
class EvidenceImage:
    """One of a reply's evidence_images: the frame's stamp (seconds), its camera, RGB uint8 [H, W, 3]."""

    stamp: float
    camera: str
    rgb: np.ndarray
    jpeg: bytes


def evidence_images(reply) -> list[EvidenceImage]:
    """A reply's ``evidence_images`` (Ask or When asked ``with_images=True``) decoded to arrays, in
    the reply's order (docs/show.md)."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415 - only a caller that wants pictures pays for the import

    out = []
    for msg in getattr(reply, "evidence_images", []):
        data = bytes(msg.data)
        with Image.open(io.BytesIO(data)) as image:
            rgb = np.asarray(image.convert("RGB"))
        out.append(EvidenceImage(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9, msg.header.frame_id, rgb, data))
    return out
