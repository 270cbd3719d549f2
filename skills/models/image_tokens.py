"""Input images of the token-billed image models (GPT Image), priced by their tokens: each image's
dimensions, read from the file's own header, turned into image tokens by OpenAI's rule.

The dimensions come from the header of the formats OpenAI accepts for these models (PNG, JPEG,
WebP); `image_dimensions` answers None for anything else, and the route refuses such a file with a
400 naming its field, before any quote (the upstream would refuse it too, after the payment).

The rule is OpenAI's, for GPT Image 1 (and the mini), in the "Images and vision" guide, "Calculating
costs", GPT Image 1 (https://platform.openai.com/docs/guides/images-vision#calculating-costs): an
input image is costed like GPT-4o's high-detail tiles, "except that we scale down the image so that
the shortest side is 512px instead of 768px"; with low input fidelity (the default) "the base cost
is 65 image tokens, and each tile costs 129 image tokens". In full:

1. scaled down (aspect kept) to fit within 2048 x 2048;
2. scaled down so that its shortest side is 512px (a smaller image is not scaled up);
3. tiles = ceil(width / 512) x ceil(height / 512); tokens = 65 + 129 x tiles.

Sizes are exact fractions and tiles are rounded up, so this never counts fewer tiles than the rule
(a side scaled to 512.5px is two tiles). The most one image can cost is 4 tiles (512 x 2048): 581
tokens. High input fidelity adds 4,096 to 6,144 tokens per image; the route refuses
`input_fidelity` instead of pricing it.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp")  # the formats `image_dimensions` reads
MAX_SIDE = 2048  # step 1: fit within this square
SHORT_SIDE = 512  # step 2: the shortest side, scaled down to this (768 for GPT-4o)
TILE = 512
BASE_TOKENS = 65
TILE_TOKENS = 129
MAX_IMAGE_TOKENS = BASE_TOKENS + TILE_TOKENS * 4  # 512 x 2048: the dearest shape


def image_tokens(width: int, height: int) -> int:
    """Input image tokens of a `width` x `height` image on a GPT Image model (low input fidelity)."""
    w, h = Fraction(width), Fraction(height)
    fit = min(Fraction(1), MAX_SIDE / max(w, h))
    w, h = w * fit, h * fit
    shrink = min(Fraction(1), SHORT_SIDE / min(w, h))
    w, h = w * shrink, h * shrink
    return BASE_TOKENS + TILE_TOKENS * math.ceil(w / TILE) * math.ceil(h / TILE)


def image_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, JPEG or WebP header; None when it is none of them or unreadable."""
    for reader in (_png, _jpeg, _webp):
        try:
            size = reader(data)
        except (struct.error, IndexError):
            size = None
        if size is not None:
            return size if size[0] > 0 and size[1] > 0 else None
    return None


def _png(data: bytes) -> tuple[int, int] | None:
    # signature, then the IHDR chunk first: length, "IHDR", width, height (big-endian)
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# Start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The frame header's size: segments are walked from SOI up to the first SOFn (before the scan)."""
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers: no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before them
            return None
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: the key frame's start code, then 14-bit width and height
        if data[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":  # lossless: signature 0x2f, then 14 bits each of width-1 and height-1
        if data[20] != 0x2F:
            return None
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24 bits each of canvas width-1 and height-1
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None
