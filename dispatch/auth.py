"""Bearer API keys with roles. Only SHA-256 hashes of keys are stored.

Keys are long random tokens, so a plain SHA-256 is enough (no password stretching needed),
and a lookup is one dict access. Local development keys are made by `ensure_dev_keys`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dispatch.settings import AuthSettings


class Role(StrEnum):
    CLIENT = "client"
    WORKER = "worker"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key's name, role and the client id its jobs belong to."""

    name: str
    role: Role
    client_id: str

    def can(self, *roles: Role) -> bool:
        return self.role is Role.ADMIN or self.role in roles


class KeyFileError(Exception):
    """The keys file is unreadable or malformed; the message names it."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Hash -> principal, loaded once from the keys file."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_hash = principals

    @classmethod
    def load(cls, keys_file: Path) -> KeyRing:
        try:
            document = json.loads(keys_file.read_text())
            principals = {
                str(entry["sha256"]): Principal(
                    str(entry["name"]), Role(entry["role"]), str(entry["client_id"])
                )
                for entry in document["keys"]
            }
        except FileNotFoundError as error:
            raise KeyFileError(f"{keys_file} does not exist: run `dispatch keys`") from error
        except (ValueError, KeyError, TypeError) as error:
            raise KeyFileError(f"{keys_file} is malformed: {error!r}") from error
        return cls(principals)

    def identify(self, key: str) -> Principal | None:
        return self._by_hash.get(hash_key(key))


DEV_ROLES = (Role.ADMIN, Role.CLIENT, Role.WORKER)


def ensure_dev_keys(auth: AuthSettings) -> dict[str, str]:
    """The local development keys by role, created on first use (hashes to keys_file)."""
    if auth.dev_keys_file.is_file() and auth.keys_file.is_file():
        keys: dict[str, str] = json.loads(auth.dev_keys_file.read_text())
        ring = KeyRing.load(auth.keys_file)
        if all(ring.identify(keys.get(role.value, "")) for role in DEV_ROLES):
            return keys
    keys = {role.value: f"dk_{role.value}_{secrets.token_urlsafe(24)}" for role in DEV_ROLES}
    entries = [
        {"name": f"dev-{role}", "role": role, "client_id": "dev", "sha256": hash_key(key)}
        for role, key in keys.items()
    ]
    existing: list[dict[str, str]] = []
    if auth.keys_file.is_file():
        existing = [
            entry
            for entry in json.loads(auth.keys_file.read_text())["keys"]
            if not str(entry.get("name", "")).startswith("dev-")
        ]
    auth.keys_file.parent.mkdir(parents=True, exist_ok=True)
    auth.keys_file.write_text(json.dumps({"keys": existing + entries}, indent=2) + "\n")
    auth.dev_keys_file.parent.mkdir(parents=True, exist_ok=True)
    # The plain keys are for this machine's user only.
    descriptor = os.open(auth.dev_keys_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        json.dump(keys, stream, indent=2)
    return keys
