"""Fuzzing the image conversion with hypothesis (docs/reliability.md, "Bad images"): every sensor_msgs
Image (real message class, any field values) either converts to the RGB frame the rule of
docs/interfaces.md ("Images") describes, or is rejected with ImageRejected and the reason that rule
gives; nothing else is ever raised. Corrupted PNG / JPEG / BMP / GIF / TIFF bytes are only ever rejected
(or converted), never raise anything else (a BMP header claiming billions of pixels made Pillow raise
DecompressionBombError, which an image callback would not have caught).

The oracle is the rule as docs/interfaces.md and the module docstring state it, written out here: valid
when the encoding is one of the five 8-bit colour/mono encodings, both sides >= 1, at most
max_pixels pixels, step >= width * bpp and len(data) == step * height (checked in that order)."""
import io

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage, Image

from streamcache_ros.node import image_conversion as ic

BPP = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}
WIDE = {"16UC1", "16SC1", "32FC1", "64FC1", "mono16", "rgb16", "bgra16", "16UC3", "32SC4"}
ENCODINGS = [*BPP, *WIDE, "yuv422", "bayer_rggb8", "8UC3", "nv21", "", "RGB8", "rgb8 "]
UINT32 = 2**32 - 1
SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def expected_reason(encoding, height, width, step, size, max_pixels):
    if size == 0:
        return ic.EMPTY
    if encoding not in BPP:
        return ic.DEPTH if encoding in WIDE else ic.ENCODING
    if height < 1 or width < 1:
        return ic.DIMENSIONS
    if height * width > max_pixels:
        return ic.TOO_LARGE
    if step < width * BPP[encoding]:
        return ic.STEP
    if step * height != size:
        return ic.SIZE
    return None


@st.composite
def images(draw):
    """Mostly near-valid images (a valid one with at most one field changed), some arbitrary."""
    encoding = draw(st.sampled_from(ENCODINGS) | st.text(max_size=6))
    height, width = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    bpp = BPP.get(encoding, draw(st.integers(1, 4)))
    step = width * bpp + draw(st.integers(0, 5))
    data = draw(st.binary(min_size=step * height, max_size=step * height))
    change = draw(st.sampled_from(["none", "none", "height", "width", "step", "data", "huge", "arbitrary"]))
    if change == "height":
        height = draw(st.integers(0, UINT32))
    elif change == "width":
        width = draw(st.integers(0, UINT32))
    elif change == "step":
        step = draw(st.integers(0, UINT32))
    elif change == "data":
        data = draw(st.binary(max_size=2 * len(data) + 4))
    elif change == "huge":  # a header claiming an 8K frame
        width, height = 7680, 4320
    elif change == "arbitrary":
        height, width, step = (draw(st.integers(0, UINT32)) for _ in range(3))
        data = draw(st.binary(max_size=64))
    msg = Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=draw(st.integers(0, 1)))
    msg.data = data
    return msg


@SETTINGS
@given(msg=images(), max_pixels=st.sampled_from([ic.DEFAULT_MAX_PIXELS, 64, 1]))
def test_raw_images_convert_or_are_rejected_by_the_rule(msg, max_pixels):
    size = len(msg.data)
    reason = expected_reason(msg.encoding, msg.height, msg.width, msg.step, size, max_pixels)
    try:
        rgb = ic.image_to_rgb(msg, max_pixels)
    except ic.ImageRejected as err:
        assert err.reason == reason, (err.reason, reason, str(err))
        assert str(err)
        return
    assert reason is None, f"accepted an image the rule rejects ({reason})"
    assert rgb.shape == (msg.height, msg.width, 3) and rgb.dtype == np.uint8 and rgb.flags.c_contiguous
    bpp = BPP[msg.encoding]
    data = bytes(msg.data)
    for y, x in {(0, 0), (msg.height - 1, msg.width - 1), (msg.height // 2, msg.width // 3)}:
        pixel = data[y * msg.step + x * bpp:y * msg.step + (x + 1) * bpp]  # row padding skipped
        expected = {"rgb8": pixel, "rgba8": pixel[:3], "bgr8": pixel[::-1], "bgra8": pixel[2::-1],
                    "mono8": pixel * 3}[msg.encoding]
        assert bytes(rgb[y, x]) == expected


def _encoded(fmt):
    rgb = np.arange(8 * 6 * 3, dtype=np.uint8).reshape(8, 6, 3) * 5
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, format=fmt)
    return out.getvalue()


ENCODED = {fmt.lower(): _encoded(fmt) for fmt in ("PNG", "JPEG", "BMP", "GIF", "TIFF")}


@st.composite
def corrupted(draw):
    fmt = draw(st.sampled_from(sorted(ENCODED)))
    data = bytearray(ENCODED[fmt])
    for _ in range(draw(st.integers(0, 6))):
        # headers (sizes, offsets) are where a flipped byte does the most harm
        end = draw(st.sampled_from([min(len(data), 40), len(data)]))
        data[draw(st.integers(0, end - 1))] = draw(st.integers(0, 255))
    data = data[:draw(st.integers(0, len(data)))]
    msg = CompressedImage(format=draw(st.sampled_from([fmt, "png", "jpeg", "bmp", ""]) | st.text(max_size=8)))
    msg.data = bytes(data)
    return msg


@SETTINGS
@given(msg=corrupted())
def test_corrupted_compressed_images_are_rejected_not_raised(msg):
    try:
        rgb = ic.image_to_rgb(msg)
    except ic.ImageRejected as err:
        allowed = {ic.EMPTY} if len(msg.data) == 0 else {ic.DECODE, ic.DEPTH, ic.TOO_LARGE}
        assert err.reason in allowed, (err.reason, str(err))
        return
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3


def test_a_bmp_header_claiming_billions_of_pixels_is_too_large():
    data = bytearray(ENCODED["bmp"])
    data[18:26] = (200_000).to_bytes(4, "little") + (100_000).to_bytes(4, "little")  # width, height
    msg = CompressedImage(format="bmp")
    msg.data = bytes(data)
    try:
        ic.image_to_rgb(msg)
    except ic.ImageRejected as err:
        assert err.reason == ic.TOO_LARGE
    else:
        raise AssertionError("accepted a 20-gigapixel BMP")
