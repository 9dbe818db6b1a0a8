"""Password hashes for the console's users: ``scrypt$N$r$p$SALT$HASH`` (the default) or
``pbkdf2_sha256$ITERATIONS$SALT$HASH``, salt and hash in unpadded URL-safe base64.

Only the hash is ever configured; a password is compared by hashing it the same way and a
constant-time comparison, so neither the password nor the hash shows in any answer or log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SCRYPT_N = 1 << 14  # 16 MiB of memory and about 50 ms of one core per check
SCRYPT_R = 8
SCRYPT_P = 1
PBKDF2_MIN_ITERATIONS = 100_000
_MAX_SCRYPT_N = 1 << 20
_SALT_BYTES = 16
_KEY_BYTES = 32
FORMS = "scrypt$N$r$p$SALT$HASH or pbkdf2_sha256$ITERATIONS$SALT$HASH (hrwcron hash-password)"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    key = _scrypt(password.encode(), salt, (SCRYPT_N, SCRYPT_R, SCRYPT_P), _KEY_BYTES)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def _scrypt(password: bytes, salt: bytes, params: tuple[int, ...], length: int) -> bytes:
    n, r, p = params
    # scrypt needs 128 * r * n bytes; the default cap (32 MiB) would refuse larger hashes.
    memory = 256 * r * n * p + (1 << 20)
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=memory, dklen=length)


def _parsed(encoded: str) -> tuple[str, tuple[int, ...], bytes, bytes]:
    """(scheme, parameters, salt, hash); raises ValueError saying what is wrong."""
    parts = encoded.split("$")
    scheme = parts[0]
    if scheme == "scrypt" and len(parts) == 6:
        numbers, salt, key = parts[1:4], parts[4], parts[5]
    elif scheme == "pbkdf2_sha256" and len(parts) == 4:
        numbers, salt, key = parts[1:2], parts[2], parts[3]
    else:
        raise ValueError(f"is not a password hash; expected {FORMS}")
    if not all(n.isdigit() for n in numbers):
        raise ValueError(f"has parameters that are not numbers; expected {FORMS}")
    params = tuple(int(n) for n in numbers)
    try:
        salt_bytes, key_bytes = _unb64(salt), _unb64(key)
    except (binascii.Error, ValueError):
        raise ValueError("has a salt or hash that is not base64") from None
    if len(salt_bytes) < 8 or len(key_bytes) < 16:
        raise ValueError("has a salt shorter than 8 bytes or a hash shorter than 16")
    if scheme == "scrypt":
        n, r, p = params
        if n < 2 or n & (n - 1) or n > _MAX_SCRYPT_N or not 1 <= r <= 32 or not 1 <= p <= 16:
            raise ValueError(
                f"has scrypt parameters out of range (N a power of 2 up to {_MAX_SCRYPT_N}, "
                "r 1-32, p 1-16)"
            )
    elif params[0] < PBKDF2_MIN_ITERATIONS:
        raise ValueError(f"has fewer than {PBKDF2_MIN_ITERATIONS} PBKDF2 iterations")
    return scheme, params, salt_bytes, key_bytes


def hash_problem(encoded: str) -> str | None:
    """Why ``encoded`` is not a usable password hash, or None. Never quotes it."""
    try:
        _parsed(encoded)
    except ValueError as exc:
        return str(exc)
    return None


def verify_password(encoded: str, password: str) -> bool:
    """Whether ``password`` hashes to ``encoded``; False for a malformed hash too. Costs what
    the hash's parameters say (tens of milliseconds): call it off the event loop."""
    try:
        scheme, params, salt, key = _parsed(encoded)
    except ValueError:
        return False
    if scheme == "scrypt":
        given = _scrypt(password.encode(), salt, params, len(key))
    else:
        given = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, params[0], len(key))
    return hmac.compare_digest(given, key)
