"""sensor_msgs Image / CompressedImage -> RGB uint8 [H, W, 3], or ImageRejected with a reason code.

Validity (docs/interfaces.md "Images"): a raw image is valid when its encoding is one of
rgb8/bgr8/mono8/rgba8/bgra8, ``step >= width * bytes_per_pixel`` and ``len(data) == step * height``;
rows are read ``width * bpp`` bytes each and any row padding is skipped. Size rule: an image of more
than ``max_pixels`` pixels (the node's ``max_image_pixels``, default 4096 x 4096, so an 8K frame of
7680 x 4320 is refused) is rejected before anything is converted or decoded; smaller ones are taken
as they are (the model's image processor resizes them). A depth or other 16/32/64-bit image
(16UC1, mono16, 32FC1, ...) on a colour camera topic is rejected with its own reason.

cv_bridge converts when it is importable (a robot's ROS 2 install); ROS 2's cv_bridge is not on PyPI,
so elsewhere the numpy conversion below does the same job (compressed images through Pillow). Both
paths validate first with the same rule, so what is rejected does not depend on the path. No rclpy
here: messages are read by attribute, so this module is testable on its own.
"""
from __future__ import annotations

import io
import re

import numpy as np

BYTES_PER_PIXEL = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}
# Larger frames are refused before decoding: a camera of 4096x4096 is already far above what the
# vision encoders here resize to, and a malformed header must not make the node allocate gigabytes.
DEFAULT_MAX_PIXELS = 4096 * 4096

# Reason codes (counted per camera, shown in diagnostics)
EMPTY = "empty"
ENCODING = "encoding"
DIMENSIONS = "dimensions"
STEP = "step"
SIZE = "size"
TOO_LARGE = "too_large"
DECODE = "decode"
DEPTH = "depth"
REASONS = (EMPTY, ENCODING, DEPTH, DIMENSIONS, STEP, SIZE, TOO_LARGE, DECODE)
# sensor_msgs image_encodings with more than 8 bits per channel: depth maps, 16-bit mono / colour
_WIDE_ENCODING = re.compile(r"^((mono|rgb|bgr|rgba|bgra)16|(8|16|32|64)[USF]C[1-4]?)$")


class ImageRejected(ValueError):
    """The message cannot be turned into a frame; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def is_compressed(msg) -> bool:
    return hasattr(msg, "format") and not hasattr(msg, "encoding")


def check_raw_image(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
    """Validate a sensor_msgs/Image without converting it; returns bytes per pixel."""
    encoding, height, width, step = msg.encoding, int(msg.height), int(msg.width), int(msg.step)
    if len(msg.data) == 0:
        raise ImageRejected(EMPTY, f"image has no data ({width}x{height} '{encoding}')")
    bpp = BYTES_PER_PIXEL.get(encoding)
    if bpp is None:
        if _WIDE_ENCODING.match(encoding) and not encoding.startswith("8"):
            raise ImageRejected(DEPTH, f"'{encoding}' is a depth or 16/32/64-bit image, not a colour camera image "
                                       f"(one of: {', '.join(BYTES_PER_PIXEL)}): is the topic the depth stream?")
        raise ImageRejected(ENCODING, f"unsupported encoding '{encoding}' (one of: {', '.join(BYTES_PER_PIXEL)})")
    if height < 1 or width < 1:
        raise ImageRejected(DIMENSIONS, f"image is {width}x{height}")
    if height * width > max_pixels:
        raise ImageRejected(TOO_LARGE, f"image is {width}x{height}, more than {max_pixels} pixels (max_image_pixels)")
    if step < width * bpp:
        raise ImageRejected(STEP, f"step {step} is less than width {width} x {bpp} bytes ('{encoding}')")
    if len(msg.data) != step * height:
        raise ImageRejected(SIZE, f"data is {len(msg.data)} bytes, step {step} x height {height} = {step * height}")
    return bpp


def raw_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """numpy conversion of a valid raw image; a fresh contiguous array (the message can be freed)."""
    bpp = check_raw_image(msg, max_pixels)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, step)
    pixels = rows[:, :width * bpp].reshape(height, width, bpp)  # row padding skipped
    encoding = msg.encoding
    if encoding == "mono8":
        rgb = np.repeat(pixels, 3, axis=2)
    elif encoding == "rgb8":
        rgb = pixels
    elif encoding == "rgba8":
        rgb = pixels[:, :, :3]
    else:  # bgr8, bgra8: channels 2, 1, 0
        rgb = pixels[:, :, 2::-1]
    return np.ascontiguousarray(rgb)


def check_compressed(msg) -> None:
    """What can be said of a sensor_msgs/CompressedImage before decoding it."""
    if len(msg.data) == 0:
        raise ImageRejected(EMPTY, f"compressed image has no data (format '{msg.format}')")
    if "compresseddepth" in msg.format.lower():
        raise ImageRejected(DEPTH, f"'{msg.format}' is a depth image, not a colour camera image")


def compressed_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode a sensor_msgs/CompressedImage (JPEG, PNG, ... whatever Pillow reads)."""
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415

    check_compressed(msg)
    try:
        image = Image.open(io.BytesIO(bytes(msg.data)))  # lazy: reads the header only
        width, height = image.size
        if width * height > max_pixels:
            raise ImageRejected(TOO_LARGE, f"image is {width}x{height}, more than {max_pixels} pixels "
                                           f"(max_image_pixels)")
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except ImageRejected:
        raise
    except Image.DecompressionBombError as err:  # a header claiming billions of pixels
        raise ImageRejected(TOO_LARGE, f"compressed image header: {err}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise ImageRejected(DECODE, f"cannot decode compressed image (format '{msg.format}'): {err}") from None
    except Exception as err:  # noqa: BLE001 - Pillow's decoders raise more kinds on corrupt data
        raise ImageRejected(DECODE, f"cannot decode compressed image (format '{msg.format}'): "
                                    f"{type(err).__name__}: {err}") from None
    return np.ascontiguousarray(rgb)


def _load_cv_bridge():
    try:
        from cv_bridge import CvBridge  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - not installed, or installed without OpenCV
        return None
    return CvBridge()


class ImageConverter:
    """Converts with cv_bridge when importable, else numpy/Pillow; validation is shared."""

    def __init__(self, max_pixels: int = DEFAULT_MAX_PIXELS, use_cv_bridge: bool = True):
        self.max_pixels = max_pixels
        self.bridge = _load_cv_bridge() if use_cv_bridge else None

    @property
    def backend(self) -> str:
        return "cv_bridge" if self.bridge is not None else "numpy"

    def to_rgb(self, msg) -> np.ndarray:
        if self.bridge is None:
            return image_to_rgb(msg, self.max_pixels)
        if is_compressed(msg):
            check_compressed(msg)
            convert = self.bridge.compressed_imgmsg_to_cv2
        else:
            check_raw_image(msg, self.max_pixels)
            convert = self.bridge.imgmsg_to_cv2
        try:
            rgb = convert(msg, desired_encoding="rgb8")
        except Exception as err:  # noqa: BLE001 - cv_bridge raises CvBridgeError and cv2.error
            raise ImageRejected(DECODE, f"cv_bridge could not convert the image: {err}") from None
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] * rgb.shape[1] > self.max_pixels:
            raise ImageRejected(DECODE, f"cv_bridge gave an array of shape {tuple(rgb.shape)}")
        return np.ascontiguousarray(rgb, dtype=np.uint8)


def image_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A sensor_msgs Image or CompressedImage -> RGB uint8 [H, W, 3] (numpy path); ImageRejected."""
    if is_compressed(msg):
        return compressed_to_rgb(msg, max_pixels)
    return raw_to_rgb(msg, max_pixels)
