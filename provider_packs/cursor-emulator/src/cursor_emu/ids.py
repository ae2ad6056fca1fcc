"""Random ids, as `uuid.uuid4()` and `secrets.token_hex()` make them.

Both are `os.urandom` underneath; importing `uuid` (with `platform`) and `secrets` (with
`hmac`, `_hashlib`, `random`, `base64`) cost more CPU than the rest of a hello session's
ids together, and every start pays its imports.
"""

from __future__ import annotations

import os


def uuid4() -> str:
    """`str(uuid.uuid4())`: 122 random bits, version 4, RFC 4122 variant."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def token_hex(nbytes: int) -> str:
    """`secrets.token_hex(nbytes)`: 2 * nbytes lowercase hex digits."""
    return os.urandom(nbytes).hex()
