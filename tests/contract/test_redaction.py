"""``contract.redaction``: a URL's user info is hidden and nothing else of it; the secrets of a URL and of storage
options (at any depth, named like credentials) are found, longest first, and scrubbed from any text.
(Store.open's refusals that never show a secret: tests/contract/test_store.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.redaction import has_user_info, redact_url, scrub, secrets_of

SECRET = "SUPERSECRET"


def test_redact_url_hides_only_user_info() -> None:
    assert redact_url("s3://KEY:SE/CR+ET@bucket/p") == "s3://***@bucket/p"
    assert redact_url("ftp://user@host/p") == "ftp://***@host/p"
    assert redact_url("s3://bucket/run@2024/p") == "s3://bucket/run@2024/p"
    assert redact_url("/local/a@b") == "/local/a@b"


@pytest.mark.parametrize(
    ("url", "has"),
    [
        ("s3://KEY:SE/CR+ET@bucket/p", True),
        ("ftp://user@host/p", True),
        ("s3://bucket/run@2024/p", False),
        ("/local/a@b", False),
        ("s3://bucket/p", False),
    ],
)
def test_has_user_info_is_what_redact_url_hides(url: str, has: bool) -> None:
    assert has_user_info(url) is has
    assert (redact_url(url) != url) is has


def test_secrets_of_a_url_are_its_user_info_whole_and_each_part() -> None:
    assert secrets_of(f"s3://AKIAFAKE:{SECRET}@bucket/x", {}) == [f"AKIAFAKE:{SECRET}", SECRET, "AKIAFAKE"]
    assert secrets_of("s3://bucket/x", {}) == []


def test_secrets_of_options_are_the_values_named_like_credentials_at_any_depth() -> None:
    options = {
        "key": "AKIAFAKE",
        "secret": SECRET,
        "anon": "false",  # not named like a credential
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": "TOKENTOKEN"},
        "config_kwargs": {"retries": {"total_max_attempts": 2}},
        "password": "pw",  # shorter than 4 characters: no secret anyone keeps, and replacing it would garble text
    }
    assert secrets_of("s3://bucket/x", options) == [SECRET, "TOKENTOKEN", "AKIAFAKE"]


def test_scrub_hides_a_secret_that_contains_another_whole() -> None:
    found = secrets_of(f"s3://AKIAFAKE:{SECRET}@bucket/x", {"secret": SECRET})
    text = f"refused AKIAFAKE:{SECRET} (key AKIAFAKE, secret {SECRET})"
    assert scrub(text, found) == "refused *** (key ***, secret ***)"


@given(secret=st.text(st.characters(exclude_characters="*"), min_size=4), before=st.text(), after=st.text())
def test_scrubbed_text_never_shows_a_secret_of_its_options(secret: str, before: str, after: str) -> None:
    found = secrets_of("s3://bucket/x", {"secret": secret})
    assert found == [secret]
    assert secret not in scrub(before + secret + after, found)  # (a secret with a "*" could be rebuilt by one)
