"""Sign-in settings: password hashes, users, the trusted header; secrets never shown."""

from __future__ import annotations

import pytest

from hrwcron.core.config import load_config
from hrwcron.core.config.schema import ConfigFileError
from hrwcron.core.passwords import hash_password, hash_problem, verify_password

HASHED = hash_password("correct horse battery")


def test_a_hash_verifies_its_password_only() -> None:
    assert verify_password(HASHED, "correct horse battery")
    assert not verify_password(HASHED, "correct horse batterz")
    assert not verify_password("scrypt$nonsense", "correct horse battery")
    assert hash_problem(HASHED) is None
    assert hash_password("same", b"0123456789abcdef") == hash_password("same", b"0123456789abcdef")
    assert hash_password("same") != hash_password("same")  # a fresh salt each time


def test_pbkdf2_hashes_are_accepted_too() -> None:
    import base64
    import hashlib

    salt = b"saltsaltsalt"
    key = hashlib.pbkdf2_hmac("sha256", b"s3cret-pass", salt, 200_000)
    encoded = "pbkdf2_sha256$200000${}${}".format(
        *(base64.urlsafe_b64encode(b).decode().rstrip("=") for b in (salt, key))
    )
    assert hash_problem(encoded) is None and verify_password(encoded, "s3cret-pass")
    weak = encoded.replace("$200000$", "$1000$")
    assert hash_problem(weak) == "has fewer than 100000 PBKDF2 iterations"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("alice", "expected NAME:HASH"),
        ("bad name!:x", "expected NAME:HASH"),
        ("alice:plaintext-password", "the hash of 'alice' is not a password hash"),
        ("alice:scrypt$3$8$1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA", "scrypt parameters out of range"),
    ],
)
def test_a_bad_user_entry_is_refused_without_quoting_it(entry: str, message: str) -> None:
    with pytest.raises(ConfigFileError) as caught:
        load_config(None, {"HRWCRON_HTTP_USERS": entry})
    text = str(caught.value)
    assert message in text
    assert "plaintext-password" not in text and "AAAAAAAAAAA" not in text


def test_users_come_from_the_file_or_the_environment_and_are_masked() -> None:
    config = load_config(None, {"HRWCRON_HTTP_USERS": f"alice:{HASHED},bob:{HASHED}"})
    assert [u.partition(":")[0] for u in config.http.users] == ["alice", "bob"]
    shown = repr(config.http) + repr(config) + str(config.redacted())
    assert HASHED not in shown and "scrypt$" not in shown
    assert "alice:***" in str(config.redacted()["http"]["users"])
    with pytest.raises(ConfigFileError, match="listed twice"):
        load_config(None, {"HRWCRON_HTTP_USERS": f"alice:{HASHED},alice:{HASHED}"})


def test_a_trusted_header_needs_the_proxies_that_may_set_it() -> None:
    with pytest.raises(ConfigFileError, match=r"needs http\.trusted_proxies"):
        load_config(None, {"HRWCRON_HTTP_TRUSTED_HEADER": "X-Forwarded-User"})
    with pytest.raises(ConfigFileError, match="is not an IP address"):
        load_config(
            None,
            {
                "HRWCRON_HTTP_TRUSTED_HEADER": "X-Forwarded-User",
                "HRWCRON_HTTP_TRUSTED_PROXIES": "proxy.local",
            },
        )
    config = load_config(
        None,
        {
            "HRWCRON_HTTP_TRUSTED_HEADER": "X-Forwarded-User",
            "HRWCRON_HTTP_TRUSTED_PROXIES": "127.0.0.1,::1",
        },
    )
    assert config.http.trusted_proxies == ["127.0.0.1", "::1"]


def test_hash_password_prints_an_entry_for_http_users(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from hrwcron.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse battery\n"))
    assert main(["hash-password", "--user", "alice"]) == 0
    out, _ = capsys.readouterr()
    name, _, encoded = out.strip().partition(":")
    assert name == "alice" and verify_password(encoded, "correct horse battery")
    assert "correct horse" not in out
    config = load_config(None, {"HRWCRON_HTTP_USERS": out.strip()})
    assert config.http.users == [out.strip()]
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["hash-password"]) == 2
    assert "at least 8 characters" in capsys.readouterr().err
