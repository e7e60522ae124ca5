"""The client's access control list calls.

Theory of operation: ACL entries live in the cluster's replicated metadata; each call is one
request at any broker (the router's `admin`), which forwards a change to the metadata
leader and answers once it is applied. Changing entries needs `cluster_admin` on the
cluster, listing them `describe` on it (or a super user). An entry is a map
`{principal, permission: allow|deny, operation, resource_type: stream|group|cluster,
pattern}` (jetstream.security.acl), or an `AclEntry`.

`AclCalls` is one part of `Client` (client.py): it holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jetstream.client.routing import Router
from jetstream.protocol import messages as m
from jetstream.security.acl import AclEntry

Entry = AclEntry | Mapping[str, Any]


def _plain(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    return [e.to_dict() if isinstance(e, AclEntry) else dict(e) for e in entries]


class AclCalls:
    """List, add and remove the cluster's ACL entries."""

    _router: Router

    async def acl_list(self, *, principal: str | None = None,
                       resource_type: str | None = None) -> list[AclEntry]:
        """The entries (of one principal, of one resource type), sorted."""
        answer = await self._router.admin(m.AclListRequest(principal, resource_type),
                                          m.AclListResponse)
        return [AclEntry.from_dict(e) for e in answer.acls]

    async def acl_add(self, entries: Iterable[Entry]) -> int:
        """Add entries (INVALID_ACL names one at fault); how many were new. Every broker
        enforces them once the metadata change is applied (within about a second)."""
        answer = await self._router.admin(m.AclAddRequest(_plain(entries)),
                                          m.AclChangeResponse)
        return answer.changed

    async def acl_remove(self, entries: Iterable[Entry]) -> int:
        """Remove entries; how many were there."""
        answer = await self._router.admin(m.AclRemoveRequest(_plain(entries)),
                                          m.AclChangeResponse)
        return answer.changed
