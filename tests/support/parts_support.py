"""Real small files for the parts tests: a PNG, a WAV, a PDF, built with the standard library."""
from __future__ import annotations

import base64
import io
import struct
import wave
import zlib


def png_bytes(width: int = 2, height: int = 2) -> bytes:
    """A valid RGB PNG of ``width`` x ``height`` red pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def wav_bytes(frames: int = 800) -> bytes:
    """A valid 8 kHz mono 16-bit WAV of silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * frames)
    return out.getvalue()


def pdf_bytes() -> bytes:
    """A one-page PDF (enough for a reader to open; its body is what matters to the wire)."""
    return (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>"
            b"endobj\n3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64(data)}"


PNG = png_bytes()
PNG_URL = data_url("image/png", PNG)
PDF = pdf_bytes()
PDF_URL = data_url("application/pdf", PDF)
WAV = wav_bytes()
IMAGE_BY_URL = "https://images.example/heron.jpg"
