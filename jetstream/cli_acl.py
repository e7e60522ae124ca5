"""The CLI's security commands and credentials: `jetstream acl add|remove|list`,
`jetstream user hash`, and the --user/--password/--token flags of every client command.

Credentials come from the flags or, better (a password on a command line shows in the
process list), from JETSTREAM_CLIENT_USER, JETSTREAM_CLIENT_PASSWORD and
JETSTREAM_CLIENT_TOKEN. `jetstream user hash` reads the password from the terminal (twice)
or from stdin, and prints the `name:hash` entry for the broker's `users` setting.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TypedDict

from jetstream.errors import InvalidAcl

if TYPE_CHECKING:
    from jetstream.client import Client


class AuthArguments(TypedDict):
    """The credential keyword arguments of jetstream.client.connect."""

    user: str | None
    password: str | None
    token: str | None


def add_auth_flags(client_flags: argparse.ArgumentParser) -> None:
    for name, what in (("user", "user name"), ("password", "password (prefer the environment)"),
                       ("token", "token user:secret")):
        client_flags.add_argument(f"--{name}", default=argparse.SUPPRESS,
                                  help=f"authentication: {what} (default: "
                                       f"$JETSTREAM_CLIENT_{name.upper()})")


def auth_options(args: argparse.Namespace,
                 environ: dict[str, str] | os._Environ[str]) -> AuthArguments:
    def one(name: str) -> str | None:
        return getattr(args, name, None) or environ.get(f"JETSTREAM_CLIENT_{name.upper()}")

    return {"user": one("user"), "password": one("password"), "token": one("token")}


# -- jetstream user hash -----------------------------------------------------------------------


def _user_hash(args: argparse.Namespace) -> int:
    from jetstream.security.auth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("error: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("error: an empty password", file=sys.stderr)
        return 1
    print(f"{args.name}:{hash_password(password)}")
    return 0


# -- jetstream acl -----------------------------------------------------------------------------


def entry_of(args: argparse.Namespace) -> dict[str, Any]:
    """The one ACL entry the flags describe (exactly one of --stream, --group, --cluster)."""
    resources = [(kind, value) for kind, value in (("stream", args.stream),
                                                  ("group", args.group))
                 if value is not None]
    if args.cluster:
        resources.append(("cluster", "cluster"))
    if len(resources) != 1:
        raise InvalidAcl("name one resource: --stream NAME|PREFIX*, --group NAME|PREFIX* or "
                         "--cluster", field="resource_type")
    resource_type, pattern = resources[0]
    return {"principal": args.principal, "permission": "deny" if args.deny else "allow",
            "operation": args.operation, "resource_type": resource_type, "pattern": pattern}


async def acl_add(js: Client, args: argparse.Namespace) -> int:
    added = await js.acl_add([entry_of(args)])
    print(json.dumps({"added": added}) if args.json else f"added {added}")
    return 0


async def acl_remove(js: Client, args: argparse.Namespace) -> int:
    removed = await js.acl_remove([entry_of(args)])
    print(json.dumps({"removed": removed}) if args.json else f"removed {removed}")
    return 0


async def acl_list(js: Client, args: argparse.Namespace) -> int:
    entries = await js.acl_list(principal=args.principal, resource_type=args.resource_type)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries]))
    else:
        for entry in entries:
            print(entry)
    return 0


def add_security_commands(commands: Any, leaf: Any) -> None:
    """`acl add|remove|list` (client commands, made by `leaf`) and `user hash`."""
    from jetstream.security.acl import ALL, OPERATIONS

    acl = commands.add_parser("acl", help="the cluster's access control lists")
    group = acl.add_subparsers(dest="acl_command", required=True)
    for name, command, what in (("add", acl_add, ("add an entry (every broker enforces it "
                                                 "within about a second)")),
                                ("remove", acl_remove, "remove an entry")):
        parser = leaf(group, name, command, what)
        parser.add_argument("--principal", required=True,
                            help="a user name, a certificate's CN, or * (every one)")
        parser.add_argument("--operation", required=True, choices=[*OPERATIONS, ALL])
        parser.add_argument("--deny", action="store_true", help="a deny entry (deny wins)")
        parser.add_argument("--stream", help="a stream name, or a prefix ending in *")
        parser.add_argument("--group", help="a consumer group name, or a prefix ending in *")
        parser.add_argument("--cluster", action="store_true", help="the cluster")
    listing = leaf(group, "list", acl_list, "list the entries")
    listing.add_argument("--principal", help="only this principal's")
    listing.add_argument("--resource-type", choices=["stream", "group", "cluster"])
    user = commands.add_parser("user", help="users of brokers with authentication")
    users = user.add_subparsers(dest="user_command", required=True)
    hashing = users.add_parser("hash", help="print NAME:HASH (argon2id) for the users "
                                            "setting; the password comes from the terminal "
                                            "or stdin")
    hashing.add_argument("name")
    hashing.set_defaults(func=_user_hash)
