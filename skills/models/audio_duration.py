"""The playing time of an uploaded audio file, read from the file itself (pure Python, no decoder).
Kept by hand for exactness: the duration is the price, and tag libraries estimate an MP3's length
from its first frame or a Xing header; the subset handled is listed below, anything else is None.

Transcription is priced per minute of audio, so the duration must come from the bytes, never from the
caller. Each reader parses only the container's own bookkeeping and returns exact seconds as a Decimal:

- WAV (RIFF/RIFX): the `fmt ` and `data` chunks (the `fact` sample count for compressed codecs). Not the
  stdlib `wave` module: on 3.11 it refuses IEEE-float and WAVE_FORMAT_EXTENSIBLE files, and it trusts the
  `data` size, which streaming writers leave at 0 or 0xFFFFFFFF (a bogus day-long quote). Here the size is
  capped at the bytes actually present.
- MP3 (MPEG-1/2/2.5 layer I/II/III): every frame header is walked and its samples counted, which is exact
  for CBR and VBR alike; ID3v2/ID3v1/APE tags and a Xing/Info/VBRI header frame are skipped.
- FLAC: STREAMINFO's total sample count. Ogg (Opus, Vorbis, FLAC): the last page's granule position.
  MP4/M4A/MOV: the `mvhd` box.

Anything else, or a file whose bookkeeping does not hold together, gives None: the caller refuses it
rather than guess a price.
"""

from __future__ import annotations

import struct
from decimal import Decimal

# The formats read here, as media types (what an upload's description may name: the OpenAPI document)
MEDIA_TYPES = ("audio/wav", "audio/mpeg", "audio/flac", "audio/ogg", "audio/mp4")
# A stream must be mostly audio frames: a random file can contain a few byte pairs that look like an MPEG
# frame sync, but not a long chain of them.
_MP3_MIN_COVERAGE = 0.9
_MP3_SCAN_LIMIT = 4096  # how far past the tags the first frame may start


def audio_duration(data: bytes) -> Decimal | None:
    """Seconds of audio in `data`, or None when the format is unknown or the file is unreadable."""
    body = data[_id3v2_end(data):]  # MP3 and (rarely) FLAC files may carry a leading ID3v2 tag
    try:
        if data[:4] in (b"RIFF", b"RIFX") and data[8:12] == b"WAVE":
            seconds = _wav(data)
        elif body[:4] == b"fLaC":
            seconds = _flac(body)
        elif data[:4] == b"OggS":
            seconds = _ogg(data)
        elif data[4:8] == b"ftyp":
            seconds = _mp4(data)
        else:
            seconds = _mp3(body)
    except (struct.error, IndexError, ValueError, ArithmeticError):
        return None
    return seconds if seconds is not None and seconds > 0 else None


# ---------------------------------------------------------------------------------------------- WAV

_WAV_LINEAR = {1, 3, 6, 7}  # PCM, IEEE float, A-law, mu-law: one block per sample frame
_WAV_EXTENSIBLE = 0xFFFE


def _wav(data: bytes) -> Decimal | None:
    endian = "<" if data[:4] == b"RIFF" else ">"
    fmt: tuple[int, int, int] | None = None  # (format tag, sample rate, block align)
    fact: int | None = None
    data_size: int | None = None
    pos = 12
    while pos + 8 <= len(data):
        chunk_id = data[pos:pos + 4]
        (size,) = struct.unpack(endian + "I", data[pos + 4:pos + 8])
        start = pos + 8
        if chunk_id == b"fmt ":
            tag, _channels, rate, _byte_rate, align = struct.unpack(endian + "HHIIH", data[start:start + 14])
            fmt = (tag, rate, align)
        elif chunk_id == b"fact" and size >= 4:
            (fact,) = struct.unpack(endian + "I", data[start:start + 4])
        elif chunk_id == b"data":
            # streaming writers leave the size at 0 or 0xFFFFFFFF: count what is really there
            available = len(data) - start
            data_size = available if size in (0, 0xFFFFFFFF) else min(size, available)
            if fmt is not None and (fact is not None or fmt[0] in _WAV_LINEAR or fmt[0] == _WAV_EXTENSIBLE):
                break  # nothing after the audio matters (and its size may be unknown)
        pos = start + size + (size & 1)  # chunks are padded to an even length
    if fmt is None or data_size is None:
        return None
    tag, rate, align = fmt
    if rate == 0:
        return None
    if tag in _WAV_LINEAR or tag == _WAV_EXTENSIBLE:
        return Decimal(data_size // align) / rate if align else None
    return Decimal(fact) / rate if fact else None


# ---------------------------------------------------------------------------------------------- MP3

_MP3_BITRATES = {  # kbit/s by (MPEG-1?, layer), index 1..14
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_TRAILERS = (b"TAG", b"APETAGEX", b"LYRICS200")


def _mp3_frame(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """(frame length, samples, sample rate) of a valid MPEG audio frame header at `pos`, else None."""
    if pos + 4 > len(data) or data[pos] != 0xFF or data[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2, b3 = data[pos + 1], data[pos + 2], data[pos + 3]
    version, layer_bits = (b1 >> 3) & 3, (b1 >> 1) & 3
    bitrate_index, rate_index, padding = b2 >> 4, (b2 >> 2) & 3, (b2 >> 1) & 1
    if version == 1 or layer_bits == 0 or bitrate_index in (0, 15) or rate_index == 3 or b3 & 3 == 2:
        return None  # reserved values; free-format bitrate (0) has no computable frame length
    mpeg1, layer = version == 3, 4 - layer_bits
    bitrate = _MP3_BITRATES[(mpeg1, layer)][bitrate_index - 1] * 1000
    rate = _MP3_RATES[version][rate_index]
    if layer == 1:
        return (12 * bitrate // rate + padding) * 4, 384, rate
    samples = 1152 if layer == 2 or mpeg1 else 576
    return samples // 8 * bitrate // rate + padding, samples, rate


def _mp3_info_frame(data: bytes, pos: int) -> bool:
    """True when the frame at `pos` is a Xing/Info/VBRI header: bookkeeping, not audio."""
    b1, b3 = data[pos + 1], data[pos + 3]
    mpeg1, mono, crc = (b1 >> 3) & 3 == 3, b3 >> 6 == 3, not b1 & 1
    side_info = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    xing = pos + 4 + 2 * crc + side_info
    return data[xing:xing + 4] in (b"Xing", b"Info") or data[pos + 36:pos + 40] == b"VBRI"


def _mp3_chained(data: bytes, pos: int) -> bool:
    """A frame at `pos` whose successor is also a frame (or the end): a real sync, not a stray 0xFF."""
    frame = _mp3_frame(data, pos)
    if frame is None:
        return False
    after = pos + frame[0]
    return after >= len(data) or data.startswith(_MP3_TRAILERS, after) or _mp3_frame(data, after) is not None


def _mp3(data: bytes) -> Decimal | None:
    pos = _mp3_sync(data, 0, _MP3_SCAN_LIMIT)
    if pos is None:
        return None
    samples: dict[int, int] = {}  # by sample rate (a stream should have one; never mixed into one count)
    audio_bytes, first, tail = 0, True, 0
    while pos < len(data):
        frame = _mp3_frame(data, pos)
        if frame is None:
            if data.startswith(_MP3_TRAILERS, pos):
                break  # tags after the audio are not junk
            resync = _mp3_sync(data, pos + 1, len(data))
            if resync is None:
                tail = len(data) - pos
                break
            pos = resync
            continue
        length, count, rate = frame
        if pos + length > len(data):
            break  # a truncated last frame: it does not decode, and it is not junk either
        if not (first and _mp3_info_frame(data, pos)):
            samples[rate] = samples.get(rate, 0) + count
        audio_bytes += length
        first = False
        pos += length
    if not samples or audio_bytes < _MP3_MIN_COVERAGE * (min(pos, len(data)) + tail):
        return None  # mostly not MPEG audio: another format, or junk around a few lucky byte pairs
    return sum((Decimal(n) / rate for rate, n in samples.items()), Decimal(0))


def _mp3_sync(data: bytes, start: int, limit: int) -> int | None:
    pos = data.find(b"\xff", start)
    while 0 <= pos < start + limit:
        if _mp3_chained(data, pos):
            return pos
        pos = data.find(b"\xff", pos + 1)
    return None


def _id3v2_end(data: bytes) -> int:
    """Offset after any leading ID3v2 tags (and the zero padding some writers put after them)."""
    pos = 0
    while data[pos:pos + 3] == b"ID3" and len(data) >= pos + 10:
        size = 0
        for byte in data[pos + 6:pos + 10]:
            size = (size << 7) | (byte & 0x7F)  # "syncsafe": 7 bits per byte
        footer = 10 if data[pos + 5] & 0x10 else 0
        pos += 10 + size + footer
    if pos == 0:
        return 0
    while pos < len(data) and data[pos] == 0:
        pos += 1
    return pos if pos < len(data) else 0


# ---------------------------------------------------------------------------------------------- FLAC


def _flac_streaminfo(block: bytes) -> Decimal | None:
    """Seconds from a 34-byte STREAMINFO block: 20-bit rate, 36-bit total samples (0 = unknown)."""
    packed = int.from_bytes(block[10:18], "big")
    rate, total = packed >> 44, packed & ((1 << 36) - 1)
    return Decimal(total) / rate if rate and total else None


def _flac(data: bytes) -> Decimal | None:
    if data[4] & 0x7F != 0:  # the first metadata block must be STREAMINFO
        return None
    return _flac_streaminfo(data[8:42])


# ---------------------------------------------------------------------------------------------- Ogg


def _ogg(data: bytes) -> Decimal | None:
    """Opus (48 kHz granules, less the pre-skip), Vorbis or FLAC-in-Ogg: the first logical stream's last
    granule position over its sample rate."""
    segments = data[26]
    packet = data[27 + segments:27 + segments + 64]
    serial = data[14:18]
    if packet.startswith(b"OpusHead"):
        rate, skip = 48000, struct.unpack("<H", packet[10:12])[0]
    elif packet.startswith(b"\x01vorbis"):
        rate, skip = struct.unpack("<I", packet[12:16])[0], 0
    elif packet.startswith(b"\x7fFLAC") and packet[9:13] == b"fLaC":
        info = packet[17:51]
        rate, skip = int.from_bytes(info[10:13], "big") >> 4, 0
    else:
        return None
    pos = data.rfind(b"OggS")
    while pos > 0:
        if data[pos + 4] == 0 and data[pos + 14:pos + 18] == serial:
            (granule,) = struct.unpack("<q", data[pos + 6:pos + 14])
            if granule >= 0:  # -1: no packet ends on this page
                return Decimal(granule - skip) / rate if rate else None
        pos = data.rfind(b"OggS", 0, pos)
    return None


# ---------------------------------------------------------------------------------------------- MP4


def _mp4_boxes(data: bytes, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    """Top-level boxes between start and end: type -> (payload start, payload end)."""
    boxes: dict[bytes, tuple[int, int]] = {}
    pos = start
    while pos + 8 <= end:
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if size == 1:
            (size,) = struct.unpack(">Q", data[pos + 8:pos + 16])
            header = 16
        elif size == 0:
            size = end - pos
        if size < header:
            return boxes
        boxes.setdefault(kind, (pos + header, min(pos + size, end)))
        pos += size
    return boxes


def _mp4(data: bytes) -> Decimal | None:
    moov = _mp4_boxes(data, 0, len(data)).get(b"moov")
    if moov is None:
        return None
    mvhd = _mp4_boxes(data, *moov).get(b"mvhd")
    if mvhd is None:
        return None
    pos = mvhd[0]
    timescale: int
    duration: int
    if data[pos] == 1:  # version 1: 64-bit times and duration
        timescale, duration = struct.unpack(">IQ", data[pos + 20:pos + 32])
    else:
        timescale, duration = struct.unpack(">II", data[pos + 12:pos + 20])
    if duration in (0, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF) or not timescale:
        return None  # fragmented or live files leave it unknown
    return Decimal(duration) / timescale
