"""Request dependencies: the node and the caller's identity."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from dispatch.api.errors import ApiError
from dispatch.api.node import Node
from dispatch.auth import KeyRing, Principal, Role


async def get_node(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def bearer_principal(keyring: KeyRing, authorization: str | None) -> Principal:
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise ApiError(401, "missing bearer API key (Authorization: Bearer <key>)")
    principal = keyring.identify(key.strip())
    if principal is None:
        raise ApiError(401, "unknown API key")
    return principal


def owner_of(principal: Principal) -> str | None:
    """Whose worker ids a key may use and settle for: its own name's; an admin's, any (None)."""
    return None if principal.role is Role.ADMIN else principal.name


async def get_principal(request: Request) -> Principal:
    keyring: KeyRing = request.app.state.keyring
    return bearer_principal(keyring, request.headers.get("authorization"))


def require(*roles: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting the given roles (admins are always admitted)."""

    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if not principal.can(*roles):
            allowed = ", ".join(role.value for role in (*roles, Role.ADMIN))
            raise ApiError(403, f"role {principal.role.value} may not do this ({allowed} may)")
        return principal

    return dependency


NodeDep = Annotated[Node, Depends(get_node)]
ClientDep = Annotated[Principal, Depends(require(Role.CLIENT))]
WorkerDep = Annotated[Principal, Depends(require(Role.WORKER))]
AdminDep = Annotated[Principal, Depends(require())]
AnyoneDep = Annotated[Principal, Depends(get_principal)]
