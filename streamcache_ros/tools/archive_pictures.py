"""Pictures of what the archive holds, for a person (docs/show.md): a contact sheet of a span with the
standing questions' P(yes) under it, and a ``when`` timeline with the frames of its peaks. PIL only:
the robot's image needs no plotting library."""
from __future__ import annotations

import math

import numpy as np

BACKGROUND, INK, FAINT = (250, 250, 250), (20, 20, 20), (200, 200, 200)
LABEL_H, BAND_H, PAD = 14, 30, 4


def _font(size: int = 11):
    from PIL import ImageFont  # noqa: PLC0415

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow before 10.1: the bitmap font, one size
        return ImageFont.load_default()


def _rgb(item) -> np.ndarray:
    """An archive Thumbnail's pixels (a method) or a client EvidenceImage's (an array)."""
    return item.rgb() if callable(item.rgb) else item.rgb


def _yes_colour(p: float) -> tuple[int, int, int]:
    """Red for no, through grey, to green for yes: readable at a glance and by the bar's height."""
    p = min(max(float(p), 0.0), 1.0)
    low, mid, high = np.array((200, 60, 50)), np.array((170, 170, 170)), np.array((40, 160, 70))
    colour = low + (mid - low) * (p / 0.5) if p < 0.5 else mid + (high - mid) * ((p - 0.5) / 0.5)
    return tuple(int(c) for c in colour)


def _fit(text: str, font, width: int, draw) -> str:
    while text and draw.textlength(text, font=font) > width:
        text = text[:-2] + "…" if len(text) > 2 else ""
    return text


def contact_sheet(thumbs, chunks: list[dict], columns: int = 8, title: str = ""):
    """A PIL image: ``thumbs`` (archive Thumbnails, oldest first) in a grid, each labelled with its
    stamp (and camera when several), then one band per standing question found in ``chunks`` (rows
    of ``ls``: first/last stamp, watch) drawing each chunk's P(yes) over the same span."""
    from PIL import Image, ImageDraw  # noqa: PLC0415

    images = [_rgb(t) for t in thumbs]
    cell_w = max(i.shape[1] for i in images)
    cell_h = max(i.shape[0] for i in images) + LABEL_H
    columns = max(1, min(columns, len(images)))
    rows = math.ceil(len(images) / columns)
    questions = sorted({q for c in chunks for q in c["watch"]})
    width = columns * (cell_w + PAD) + PAD
    header = LABEL_H + 2 * PAD
    height = header + rows * (cell_h + PAD) + PAD + len(questions) * (BAND_H + LABEL_H + PAD) + (LABEL_H if questions else 0)
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw, font = ImageDraw.Draw(sheet), _font()
    cameras = {t.camera for t in thumbs}
    t0, t1 = thumbs[0].stamp, thumbs[-1].stamp
    draw.text((PAD, PAD), _fit(f"{title}  {t0:.2f} .. {t1:.2f}  ({len(thumbs)} frames)", font, width - 2 * PAD, draw),
              fill=INK, font=font)
    for n, (thumb, rgb) in enumerate(zip(thumbs, images)):
        x = PAD + (n % columns) * (cell_w + PAD)
        y = header + (n // columns) * (cell_h + PAD)
        sheet.paste(Image.fromarray(rgb), (x + (cell_w - rgb.shape[1]) // 2, y))
        # wall-clock stamps are ten digits wide: a cell says its offset, the title the start
        label = (f"+{thumb.stamp - t0:.1f} s" if t0 > 1e6 else f"{thumb.stamp:.1f}") + (
            f" {thumb.camera}" if len(cameras) > 1 else "")
        draw.text((x, y + cell_h - LABEL_H + 1), _fit(label, font, cell_w, draw), fill=INK, font=font)
    if questions:
        _bands(draw, font, chunks, questions, [t.stamp for t in thumbs], t0, t1,
               header + rows * (cell_h + PAD) + PAD, width)
    return sheet


def _bands(draw, font, chunks, questions, shown, t0, t1, top, width) -> None:
    """Per question, a band over t0..t1: each chunk a bar as tall (and as green) as its P(yes);
    ticks on the axis mark the frames the sheet shows."""
    # a chunk's bar reaches its next frame, so chunks in a row meet with no gap between them
    step = float(np.median(np.diff(shown))) if len(shown) > 1 else 1.0
    end = t1 + step
    span = max(end - t0, 1e-9)
    left, right = PAD, width - PAD

    def x(t: float) -> float:
        return left + (min(max(t, t0), end) - t0) / span * (right - left)
    y = top
    for question in questions:
        draw.text((left, y), _fit(f"P(yes) {question}", font, right - left, draw), fill=INK, font=font)
        y += LABEL_H
        draw.rectangle((left, y, right, y + BAND_H), outline=FAINT)
        for chunk in chunks:
            if question not in chunk["watch"]:
                continue
            p = float(chunk["watch"][question])
            x0, x1 = x(chunk["first_stamp"]), x(chunk["last_stamp"] + step) - 1
            x1 = max(x1, x0 + 1)
            draw.rectangle((x0, y + BAND_H - p * BAND_H, x1, y + BAND_H), fill=_yes_colour(p))
        y += BAND_H + PAD
    for stamp in shown:
        draw.line((x(stamp), y, x(stamp), y + 4), fill=INK)
    draw.text((left, y + 4), f"{t0:.1f}", fill=INK, font=font)
    last = f"{end:.1f}"
    draw.text((right - draw.textlength(last, font=font), y + 4), last, fill=INK, font=font)


def timeline_plot(stamps, probabilities, peaks, question: str, size: tuple[int, int] = (960, 420)):
    """A PIL image: P(yes) over the window (a line through the timeline's points), and above it the
    thumbnails of ``peaks`` (archive Thumbnails or client EvidenceImages; None entries skipped)
    joined to their place on the time axis."""
    from PIL import Image, ImageDraw  # noqa: PLC0415

    width, height = size
    image = Image.new("RGB", size, BACKGROUND)
    draw, font = ImageDraw.Draw(image), _font()
    draw.text((PAD, PAD), _fit(f"P(yes) {question}", font, width - 2 * PAD, draw), fill=INK, font=font)
    thumbs = [p for p in peaks if p is not None]
    strip_h = 0
    if thumbs:
        per = max(1, (width - PAD) // len(thumbs) - PAD)
        strip_h = min(140, max(min(_rgb(t).shape[0] * per // _rgb(t).shape[1] for t in thumbs), 20)) + LABEL_H
    plot_top, plot_bottom = LABEL_H + 2 * PAD + strip_h + PAD, height - LABEL_H - 2 * PAD
    left, right = 36, width - PAD
    stamps = [float(s) for s in stamps]
    t0, t1 = (min(stamps), max(stamps)) if stamps else (0.0, 1.0)
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return left + (t - t0) / span * (right - left)

    def y(p: float) -> float:
        return plot_bottom - float(p) * (plot_bottom - plot_top)
    for level in (0.0, 0.5, 1.0):
        draw.line((left, y(level), right, y(level)), fill=FAINT)
        draw.text((PAD, y(level) - 6), f"{level:.1f}", fill=INK, font=font)
    points = [(x(s), y(p)) for s, p in sorted(zip(stamps, probabilities))]
    if len(points) > 1:
        draw.line(points, fill=(40, 90, 170), width=2)
    for px, py in points:
        draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=(40, 90, 170))
    draw.text((left, plot_bottom + PAD), f"{t0:.1f}", fill=INK, font=font)
    end = f"{t1:.1f} s"
    draw.text((right - draw.textlength(end, font=font), plot_bottom + PAD), end, fill=INK, font=font)
    if thumbs:
        slot = (width - PAD) // len(thumbs)
        for n, thumb in enumerate(sorted(thumbs, key=lambda t: t.stamp)):
            rgb = Image.fromarray(_rgb(thumb))
            rgb.thumbnail((slot - PAD, strip_h - LABEL_H))
            tx = PAD + n * slot + (slot - PAD - rgb.width) // 2
            ty = LABEL_H + 2 * PAD
            image.paste(rgb, (tx, ty))
            draw.text((tx, ty + rgb.height), f"{thumb.stamp:.1f}", fill=INK, font=font)
            nearest = min(range(len(stamps)), key=lambda i: abs(stamps[i] - thumb.stamp)) if stamps else None
            p = probabilities[nearest] if nearest is not None else 0.0
            draw.line((tx + rgb.width // 2, ty + rgb.height + LABEL_H, x(thumb.stamp), y(p)), fill=FAINT)
    return image
