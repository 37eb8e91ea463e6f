"""Secrets stay out of log lines and error messages."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from stride.obs.logging import configure_logging
from stride.obs.secrets import MASK, redact, secret_key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nats://stride:hunter2@127.0.0.1:4222", "nats://stride:***@127.0.0.1:4222"),
        ("tls://hunter2@nats:4222", "tls://***@nats:4222"),  # a NATS token
        (
            "nats://a:hunter2@one:4222,nats://b:hunter2@two:4222",
            "nats://a:***@one:4222,nats://b:***@two:4222",
        ),
        ("postgresql+psycopg://app:hunter2@db/stride", "postgresql+psycopg://app:***@db/stride"),
        ("reach 'nats://u:hunter2@h:1'", "reach 'nats://u:***@h:1'"),  # in an error message
        ("postgresql://app@db/stride", "postgresql://app@db/stride"),  # a user name, kept
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),  # nothing to mask
        ("mail ops@example.com", "mail ops@example.com"),  # not a URL's userinfo
        ("http://host/path@v2", "http://host/path@v2"),  # an @ after the host
    ],
)
def test_credentials_in_urls_are_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("nats_password", True),
        ("token", True),
        ("api_key", True),
        ("authorization", True),
        ("passed", False),
        ("tokenizer", False),
        ("job_id", False),
    ],
)
def test_fields_named_as_secrets(key: str, secret: bool) -> None:
    assert secret_key(key) is secret


def test_every_log_line_is_masked(capsys: pytest.CaptureFixture[str]) -> None:
    """Event, fields (nested too), exceptions and stdlib loggers' lines alike."""
    configure_logging("test", "DEBUG", json=True)
    log = structlog.get_logger("test")
    url = "nats://stride:hunter2@127.0.0.1:4222"
    log.info(f"connecting to {url}", url=url, settings={"token": "hunter2", "urls": [url]})
    log.warning("auth", password="hunter2", api_key="hunter2")
    try:
        raise ConnectionError(f"cannot connect to {url}")
    except ConnectionError:
        log.exception("failed")
    logging.getLogger("nats.aio.client").error("lost %s", url)
    err = capsys.readouterr().err
    assert "hunter2" not in err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(lines) == 4
    first = lines[0]
    assert first["event"] == "connecting to nats://stride:***@127.0.0.1:4222"
    assert first["settings"] == {"token": MASK, "urls": ["nats://stride:***@127.0.0.1:4222"]}
    assert lines[1]["password"] == MASK and lines[1]["api_key"] == MASK
    assert "nats://stride:***@127.0.0.1:4222" in lines[2]["exception"]
    assert lines[3]["event"] == "lost nats://stride:***@127.0.0.1:4222"
