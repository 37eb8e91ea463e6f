"""A service given a wrong NATS or database URL fails at once with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stride.runtime.embedded_nats import free_port

pytestmark = pytest.mark.integration


def run_admission(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    full_env.update(
        {
            "STRIDE_ADMISSION_GRPC_PORT": str(free_port()),
            "STRIDE_CONNECT_TIMEOUT_SECONDS": "2",
            "STRIDE_TLS_DIR": os.environ["STRIDE_TLS_DIR"],  # the session's certificates
            **env,
        }
    )
    full_env["STRIDE_ADMISSION_CONNECT_TIMEOUT_SECONDS"] = "2"
    return subprocess.run(
        [sys.executable, "-m", "stride.admission", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unreachable_nats(tmp_path: Path) -> None:
    result = run_admission(
        {
            "STRIDE_NATS_URL": f"nats://127.0.0.1:{free_port()}",
            "STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
        }
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("stride.admission: cannot connect to NATS at nats://127.0.0.1:")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://stride:hunter2@127.0.0.1:{port}", "nats://stride:***@127.0.0.1:"),
        ("nats://hunter2@127.0.0.1:{port}", "nats://***@127.0.0.1:"),  # a NATS token
    ],
)
def test_a_password_in_the_nats_url_is_never_shown(tmp_path: Path, url: str, shown: str) -> None:
    """The URL is named in the error, with its credentials masked, on stderr and in every
    log line (the service logs the same error as JSON)."""
    result = run_admission(
        {
            "STRIDE_NATS_URL": url.format(port=free_port()),
            "STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
            "STRIDE_ADMISSION_LOG_LEVEL": "DEBUG",
        }
    )
    assert result.returncode == 2
    assert "hunter2" not in result.stdout + result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("stride.admission:")]
    assert said and said[0].startswith(f"stride.admission: cannot connect to NATS at {shown}")
    assert '"startup failed"' in result.stderr  # the JSON line was written, and masked


def test_malformed_nats_url(tmp_path: Path) -> None:
    result = run_admission(
        {
            "STRIDE_NATS_URL": "http://localhost:4222",
            "STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
        }
    )
    assert result.returncode == 2
    assert "STRIDE_ADMISSION_NATS_URL" in result.stderr and "nats://host:port" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_nats_url_says_how_to_set_it(tmp_path: Path) -> None:
    result = run_admission({"STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}"})
    assert result.returncode == 2
    assert "no NATS URL: set STRIDE_NATS_URL" in result.stderr


def test_unreachable_database(nats_url: str) -> None:
    result = run_admission(
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/stride",
        }
    )
    assert result.returncode == 2
    assert "cannot reach database postgresql://postgres@127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr


def test_unmigrated_database_fails_clearly_then_migrate_fixes_it(
    nats_url: str, tmp_path: Path
) -> None:
    env = {
        "STRIDE_NATS_URL": nats_url,
        "STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
        "STRIDE_ADMISSION_AUTO_MIGRATE": "false",
    }
    result = run_admission(env)
    assert result.returncode == 2
    assert "admission database is at revision none, expected 0009" in result.stderr
    assert "python -m stride.admission migrate" in result.stderr
    migrated = run_admission(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr


def test_without_certificates_it_refuses_to_start_and_says_what_to_set(tmp_path: Path) -> None:
    """mTLS is on by default: no TLS material and no explicit STRIDE_INSECURE, no server."""
    result = run_admission(
        {"STRIDE_NATS_URL": f"nats://127.0.0.1:{free_port()}", "STRIDE_TLS_DIR": ""}
    )
    assert result.returncode != 0
    assert "no TLS material for 'admission'" in result.stderr
    assert "stride certs init" in result.stderr and "STRIDE_INSECURE=1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_folder_without_the_services_certificate_is_named(tmp_path: Path) -> None:
    result = run_admission(
        {"STRIDE_NATS_URL": f"nats://127.0.0.1:{free_port()}", "STRIDE_TLS_DIR": str(tmp_path)}
    )
    assert result.returncode != 0
    assert f"STRIDE_TLS_DIR={tmp_path} has no certificate for 'admission'" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command() -> None:
    result = run_admission({}, "serve-forever")
    assert result.returncode == 2
    assert "usage: python -m stride.admission [serve|migrate]" in result.stderr
