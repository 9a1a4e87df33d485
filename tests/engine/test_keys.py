"""Key validation and the documented key → partition hash."""
import zlib

import pytest

from engine.core.errors import InvalidKey
from engine.core.keys import decode_key, encode_key, partition_for_key


@pytest.mark.parametrize(
    "key, problem",
    [
        ("", "empty"),
        ("x" * 251, "251 bytes"),
        ("é" * 126, "252 bytes"),
        ("\udc80", "UTF-8"),
    ],
)
def test_bad_keys_are_rejected_with_the_reason(key: str, problem: str) -> None:
    with pytest.raises(InvalidKey, match=problem) as info:
        encode_key(key)
    assert info.value.field == "key"


def test_limit_is_in_bytes_not_characters() -> None:
    assert encode_key("x" * 250) == b"x" * 250
    assert encode_key("é" * 125) == "é".encode() * 125


def test_decode_rejects_invalid_utf8() -> None:
    with pytest.raises(InvalidKey, match="UTF-8"):
        decode_key(b"\xff\xfe")


def test_partition_is_crc32_mod_n() -> None:
    for key in (b"a", b"user::1", "ключ".encode()):
        assert partition_for_key(key, 64) == zlib.crc32(key) % 64
    spread = {partition_for_key(f"k{i}".encode(), 64) for i in range(5000)}
    assert spread == set(range(64))
