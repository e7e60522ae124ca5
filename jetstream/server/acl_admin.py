"""The ACL requests: list, add and remove access control entries.

Theory of operation: ACL entries are metadata (jetstream.raft_meta.fsm: AddAcls,
RemoveAcls): a change is proposed like a stream's creation, committed through the metadata
Raft log (forwarded to its leader by any broker), and applied by every broker in log order,
which is what makes every broker enforce it once applied, and keeps it across a metadata
leader's failover and a restart of the whole cluster. The socket API's ACL_* requests and
the HTTP API's /acls routes both come here; who may call them is the gatekeeper's concern
(cluster_admin to change, describe on the cluster to list).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from jetstream.errors import InvalidAcl
from jetstream.protocol import messages as m
from jetstream.raft_meta.fsm import AddAcls, Command, MetadataState, RemoveAcls
from jetstream.security.acl import ACL_BATCH_MAX, AclEntry


class Proposer(Protocol):
    @property
    def state(self) -> MetadataState: ...

    async def propose(self, command: Command) -> Any: ...


def parse_entries(items: Iterable[Mapping[str, Any]]) -> tuple[AclEntry, ...]:
    """Entries from their plain forms; InvalidAcl names the first at fault."""
    entries = []
    for i, item in enumerate(items):
        try:
            entries.append(AclEntry.from_dict(item))
        except InvalidAcl as exc:
            raise InvalidAcl(f"acls[{i}]: {exc}", field=f"acls[{i}].{exc.fields.get('field')}"
                             ) from None
    if not entries or len(entries) > ACL_BATCH_MAX:
        raise InvalidAcl(f"name 1..{ACL_BATCH_MAX} entries", field="acls")
    return tuple(entries)


class AclAdmin:
    def __init__(self, metadata: Proposer) -> None:
        self._metadata = metadata

    def list(self, principal: str | None = None,
             resource_type: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """The entries (of one principal, of one resource type), sorted; the ACL version."""
        state = self._metadata.state
        entries = sorted(e for e in state.acls
                         if principal in (None, e.principal)
                         and resource_type in (None, e.resource_type))
        return [e.to_dict() for e in entries], state.acl_version

    async def add(self, items: Iterable[Mapping[str, Any]]) -> int:
        """Add entries; how many were new."""
        added: int = await self._metadata.propose(AddAcls(parse_entries(items)))
        return added

    async def remove(self, items: Iterable[Mapping[str, Any]]) -> int:
        """Remove entries; how many were there."""
        removed: int = await self._metadata.propose(RemoveAcls(parse_entries(items)))
        return removed

    # -- socket API -------------------------------------------------------------------------

    async def on_list(self, request: m.AclListRequest) -> m.AclListResponse:
        acls, version = self.list(request.principal, request.resource_type)
        return m.AclListResponse(acls, version)

    async def on_add(self, request: m.AclAddRequest) -> m.AclChangeResponse:
        return m.AclChangeResponse(await self.add(request.acls))

    async def on_remove(self, request: m.AclRemoveRequest) -> m.AclChangeResponse:
        return m.AclChangeResponse(await self.remove(request.acls))
