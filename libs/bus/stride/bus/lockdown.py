"""Lock a NATS server down for the suite: its configuration, and its streams declared.

The one place the embedded suite (``stride up``), the CLI (``stride bus config`` / ``stride
bus init``), compose's one-shots and Helm's hook Job get both from, so they cannot drift:

    python -m stride.bus.lockdown config --tls-dir DIR --out nats.conf \\
        [--cert PATH --key PATH --ca PATH] [--callout-issuer A...|env] \\
        [--system-user U...|env] [--owner UID:GID]
    python -m stride.bus.lockdown init --url tls://nats:4222 [--tls-dir DIR]

``config`` writes the lock-down part of a nats-server configuration
(:func:`stride.bus.permissions.server_config`: mutual TLS with the suite's CA, one user per
identity with the permissions the bus contract gives it, the auth callout that gives each
training pod a NATS user for its own job, ``stride.bus.callout``, and NATS's system account
with its one user, with which the pod watcher ends revoked pods' sessions,
``stride.bus.sessions``); ``--cert/--key/--ca`` are the paths *on the NATS host* when they
differ from ``DIR``'s (a container mounting the folder elsewhere; all three and
``--callout-issuer`` given, no folder is read). ``init``
declares the contract's JetStream streams as the bus administrator (the ``cli`` identity:
its certificate in ``DIR``, else where ``STRIDE_TLS_*`` names it, as for every Stride
process): on a locked server no service may, and each service fails at start, naming this
command, while a stream is missing.

Both exit 2 with a one-line error naming the problem.
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import nkeys

from stride.bus import callout, permissions
from stride.bus.client import Bus
from stride.runtime import tls
from stride.runtime.certs import SYSTEM_SEED_NAME, owner_argument, write_private
from stride.runtime.errors import StartupError


def config_text(
    folder: Path,
    *,
    cert: str | None = None,
    key: str | None = None,
    ca: str | None = None,
    callout_issuer: str | None = None,
    system_user: str | None = None,
) -> str:
    """The lock-down configuration over ``folder``'s certificates (``nats.crt``, ``nats.key``,
    ``ca.crt``), or over the paths given where NATS sees them elsewhere; the auth callout's
    issuer is the public key of ``folder``'s seed (``nats-callout.nk``) unless given
    (``env``: NATS reads it from ``$STRIDE_NATS_CALLOUT_ISSUER``). The system user is the
    public key of ``folder``'s ``nats-system.nk`` (none if it holds none) unless given
    (``env``: NATS reads it from ``$STRIDE_NATS_SYSTEM_USER``); with the issuer from the
    environment it is from the environment too, unless given: a configuration not made
    for one deployment (the Helm chart's) takes both keys from NATS's environment."""
    system: str | None
    if system_user == "env" or (system_user is None and callout_issuer == "env"):
        system = permissions.SYSTEM_USER_FROM_ENVIRONMENT
    else:
        system = system_user if system_user is not None else _system_user(folder)
    if callout_issuer == "env":
        issuer = permissions.ISSUER_FROM_ENVIRONMENT
    elif callout_issuer is not None:
        issuer = callout_issuer
    else:
        seed = folder / callout.SEED_NAME
        if not seed.is_file():
            raise StartupError(
                f"{folder} holds no {callout.SEED_NAME} (the NATS auth callout's issuer): "
                f"run `stride certs init {folder}`, or pass --callout-issuer"
            )
        try:
            issuer = callout.public_key_of(seed)
        except callout.CalloutError as error:
            raise StartupError(str(error)) from None
    try:
        return permissions.server_config(
            cert_file=cert or str(folder / "nats.crt"),
            key_file=key or str(folder / "nats.key"),
            ca_file=ca or str(folder / "ca.crt"),
            identities=tls.IDENTITIES,
            callout_issuer=issuer,
            system_user=system,
        )
    except ValueError as error:
        option = "--system-user" if "system user" in str(error) else "--callout-issuer"
        raise StartupError(f"{option}: {error}") from None


def _system_user(folder: Path) -> str | None:
    """The public key of ``folder``'s NATS system user (``nats-system.nk``), if it holds one
    (a folder made before it existed has none: ``stride certs init`` adds it)."""
    seed = folder / SYSTEM_SEED_NAME
    if not seed.is_file():
        return None
    try:
        public: bytes = nkeys.from_seed(seed.read_bytes().strip()).public_key
    except (nkeys.NkeysError, ValueError, binascii.Error) as error:
        raise StartupError(f"{seed}: not an nkey seed ({error})") from None
    return public.decode()


def write_config(text: str, out: Path, owner: tuple[int, int] | None = None) -> None:
    """Write ``text`` to ``out`` as 0600 (it names the key's path and every user), replacing
    it whole so a server never reads half a file; ``owner`` (root only) hands it over."""
    write_private(out, text.encode(), 0o600)
    if owner is not None:
        os.chown(out, *owner)


def declare_streams(url: str, environ: Mapping[str, str], timeout: float = 10.0) -> None:
    """Declare the contract's streams as the bus administrator (only it may, on a locked
    NATS); a one-line :class:`StartupError` if NATS does not take them."""

    async def declare() -> None:
        bus = await Bus.connect(
            url, "stride-bus-admin", timeout, identity=permissions.ADMIN, environ=environ
        )
        try:
            await bus.ensure_streams()
        finally:
            await bus.close()

    asyncio.run(declare())


def _folder(given: Path | None) -> Path:
    if given is not None:
        return given
    named = os.environ.get(tls.TLS_DIR_ENV, "").strip()
    if not named:
        raise StartupError(
            f"no certificate folder: pass --tls-dir, set {tls.TLS_DIR_ENV}, or give "
            "--cert, --key and --ca"
        )
    return Path(named)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stride.bus.lockdown config|init ...`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m stride.bus.lockdown")
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="write the NATS lock-down configuration")
    config.add_argument("--tls-dir", type=Path, help=f"default: ${tls.TLS_DIR_ENV}")
    config.add_argument("--out", type=Path, required=True)
    config.add_argument("--cert", help="the server certificate's path on the NATS host")
    config.add_argument("--key", help="its key's path on the NATS host")
    config.add_argument("--ca", help="the CA's path on the NATS host")
    config.add_argument("--owner", type=owner_argument, help="UID:GID to give the file to")
    config.add_argument(
        "--callout-issuer",
        help="the auth callout issuer's public key (A...), or `env` for NATS to read "
        "$STRIDE_NATS_CALLOUT_ISSUER (default: from the folder's nats-callout.nk)",
    )
    config.add_argument(
        "--system-user",
        help="the NATS system user's public key (U...), or `env` for NATS to read "
        f"${permissions.SYSTEM_USER_ENV} (default: from the folder's {SYSTEM_SEED_NAME}; "
        "`env` with --callout-issuer env)",
    )
    init = commands.add_parser("init", help="declare the streams as the bus administrator")
    init.add_argument("--url", required=True, help="the NATS to declare them on")
    init.add_argument("--tls-dir", type=Path, help=f"default: ${tls.TLS_DIR_ENV}")
    init.add_argument("--timeout", type=float, default=30.0, help="seconds to reach NATS")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "config":
            given = (arguments.cert, arguments.key, arguments.ca)
            if all(given) and arguments.callout_issuer is not None:
                folder = Path(".")
            else:
                folder = _folder(arguments.tls_dir)
                if not (folder / tls.CA_CERT_NAME).is_file() and arguments.ca is None:
                    raise StartupError(
                        f"{folder} holds no {tls.CA_CERT_NAME}: run `stride certs init "
                        f"{folder}` first"
                    )
            text = config_text(
                folder,
                cert=arguments.cert,
                key=arguments.key,
                ca=arguments.ca,
                callout_issuer=arguments.callout_issuer,
                system_user=arguments.system_user,
            )
            write_config(text, arguments.out, arguments.owner)
            print(f"NATS lock-down configuration written to {arguments.out}")
        else:
            # The administrator's certificate: from --tls-dir, else as every Stride process
            # finds its own (a folder, or the three STRIDE_TLS_*_FILE paths of a mounted
            # Kubernetes Secret).
            environ = dict(os.environ)
            if arguments.tls_dir is not None:
                environ[tls.TLS_DIR_ENV] = str(arguments.tls_dir)
                for name in (tls.CERT_FILE_ENV, tls.KEY_FILE_ENV, tls.CA_FILE_ENV):
                    environ.pop(name, None)
            declare_streams(arguments.url, environ, arguments.timeout)
            print(f"streams declared on {arguments.url}")
    except (StartupError, tls.TlsConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
