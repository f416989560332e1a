"""Image messages -> RGB frames: the five raw encodings, row padding, compressed images, and every
rejection reason (docs/reliability.md "Bad images": valid when step >= width*bpp and len(data) == step*height)."""
import io

import numpy as np
import pytest
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage, Image

from streamcache_ros.node import image_conversion as ic

# A 2 x 3 RGB image with every channel value distinct, written out by hand.
RGB = np.array([[[10, 20, 30], [40, 50, 60], [70, 80, 90]],
                [[11, 21, 31], [41, 51, 61], [71, 81, 91]]], dtype=np.uint8)


def raw(encoding, pixels, step=None, pad_byte=0xEE, height=None, width=None, data=None):
    """An Image whose rows are `pixels` rows followed by padding up to `step` bytes."""
    h, w, c = pixels.shape
    row = w * c
    step = row if step is None else step
    rows = [pixels[y].reshape(-1).tobytes() + bytes([pad_byte]) * (step - row) for y in range(h)]
    msg = Image(height=h if height is None else height, width=w if width is None else width, encoding=encoding,
                step=step)
    msg.data = b"".join(rows) if data is None else data
    return msg


@pytest.mark.parametrize("encoding, pixels", [
    ("rgb8", RGB),
    ("bgr8", RGB[:, :, ::-1]),
    ("rgba8", np.concatenate([RGB, np.full((2, 3, 1), 255, np.uint8)], axis=2)),
    ("bgra8", np.concatenate([RGB[:, :, ::-1], np.full((2, 3, 1), 7, np.uint8)], axis=2)),
])
def test_colour_encodings_give_the_same_rgb(encoding, pixels):
    out = ic.image_to_rgb(raw(encoding, pixels))
    assert out.dtype == np.uint8 and out.shape == (2, 3, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, RGB)


def test_mono8_is_repeated_on_three_channels():
    grey = RGB[:, :, :1]
    out = ic.image_to_rgb(raw("mono8", grey))
    np.testing.assert_array_equal(out, np.repeat(grey, 3, axis=2))


@pytest.mark.parametrize("encoding, pixels", [("rgb8", RGB), ("bgra8", np.zeros((2, 3, 4), np.uint8)),
                                              ("mono8", RGB[:, :, :1])])
def test_row_padding_is_skipped(encoding, pixels):
    padded = raw(encoding, pixels, step=pixels.shape[1] * pixels.shape[2] + 5)
    unpadded = raw(encoding, pixels)
    np.testing.assert_array_equal(ic.image_to_rgb(padded), ic.image_to_rgb(unpadded))


def test_the_frame_does_not_share_the_message_buffer():
    msg = raw("rgb8", RGB)
    out = ic.image_to_rgb(msg)
    msg.data = bytes(len(msg.data))  # the message is reused / freed
    np.testing.assert_array_equal(out, RGB)


@pytest.mark.parametrize("make, reason", [
    (lambda: raw("yuv422", np.zeros((2, 3, 2), np.uint8)), ic.ENCODING),
    (lambda: raw("16UC1", np.zeros((2, 3, 2), np.uint8)), ic.DEPTH),
    (lambda: raw("rgb8", RGB, data=b""), ic.EMPTY),
    (lambda: raw("rgb8", RGB, width=0), ic.DIMENSIONS),
    (lambda: raw("rgb8", RGB, step=8), ic.STEP),  # 8 < 3 pixels x 3 bytes
    (lambda: raw("rgb8", RGB, data=bytes(17)), ic.SIZE),  # 18 = step 9 x height 2
    (lambda: raw("rgb8", RGB, height=3), ic.SIZE),  # header claims a third row
    (lambda: raw("rgb8", RGB, step=10, data=bytes(18)), ic.SIZE),  # padded step, unpadded data
])
def test_bad_raw_images_are_rejected_with_their_reason(make, reason):
    with pytest.raises(ic.ImageRejected) as err:
        ic.image_to_rgb(make())
    assert err.value.reason == reason
    assert str(err.value)  # a message a person can read


def test_too_large_images_are_rejected_before_conversion():
    with pytest.raises(ic.ImageRejected) as err:
        ic.image_to_rgb(raw("rgb8", RGB), max_pixels=5)  # 6 pixels
    assert err.value.reason == ic.TOO_LARGE


def compressed(rgb, fmt):
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, format=fmt.upper())
    msg = CompressedImage(format=fmt)
    msg.data = out.getvalue()
    return msg


def test_png_is_decoded_exactly(frames):
    frame = frames(1)[0]
    np.testing.assert_array_equal(ic.image_to_rgb(compressed(frame, "png")), frame)


def test_jpeg_is_decoded_close_to_the_original(frames):
    frame = frames(1)[0]
    out = ic.image_to_rgb(compressed(frame, "jpeg"))
    assert out.shape == frame.shape
    assert np.abs(out.astype(int) - frame.astype(int)).mean() < 8  # lossy, but the same picture


@pytest.mark.parametrize("fmt, data, reason", [
    ("jpeg", b"", ic.EMPTY),
    ("jpeg", b"not an image at all", ic.DECODE),
    ("png", b"\x89PNG\r\n\x1a\n" + bytes(20), ic.DECODE),  # a PNG signature, then nothing valid
    ("16UC1; compressedDepth", b"\x00" * 32, ic.DEPTH),
])
def test_bad_compressed_images_are_rejected(fmt, data, reason):
    msg = CompressedImage(format=fmt)
    msg.data = data
    with pytest.raises(ic.ImageRejected) as err:
        ic.image_to_rgb(msg)
    assert err.value.reason == reason


def test_compressed_too_large_is_rejected_from_the_header(frames):
    with pytest.raises(ic.ImageRejected) as err:
        ic.image_to_rgb(compressed(frames(1)[0], "png"), max_pixels=100)
    assert err.value.reason == ic.TOO_LARGE


def test_converter_uses_cv_bridge_only_when_importable():
    try:
        import cv_bridge  # noqa: F401
        expected = "cv_bridge"
    except Exception:  # noqa: BLE001
        expected = "numpy"
    converter = ic.ImageConverter()
    assert converter.backend == expected
    np.testing.assert_array_equal(converter.to_rgb(raw("bgr8", RGB[:, :, ::-1])), RGB)
    with pytest.raises(ic.ImageRejected):
        converter.to_rgb(raw("rgb8", RGB, step=8))
    assert ic.ImageConverter(use_cv_bridge=False).backend == "numpy"
