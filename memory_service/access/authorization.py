"""Who may call what: the checks every route makes, and how the API's access mode is chosen.

Every route takes the caller (``CallerDep``, memory_service/http/deps.py, which reads the
key from the request) and states what it needs with ``authorize`` (a role over an agent,
and a user where the route is about one), ``require_operator``, or ``authorize_session``
(through the facade: ``MemoryService.authorize_session``) for the routes named by a session
id alone; the principal's ``Reach`` (memory_service/access/reach.py) then says what of the
agent the key may see: a key limited to some users sees their sessions and namespaces and
the shared knowledge only. Refusals say what the key lacks, never what another tenant
holds: a session of another agent is answered exactly as a session nobody recorded.

Nothing here knows HTTP: the request side (the Authorization header, the access mode the
app runs in) is the HTTP layer's.

Modes (API_AUTH): ``keys`` checks every request's key; ``open`` runs a request without a
key as the local operator (a development server on loopback) and still checks a key that
is sent, so a client behaves the same in both.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from typing import Literal, cast

from memory_service.access.keys import Principal
from memory_service.access.reach import Reach
from memory_service.domain.errors import Forbidden, NotFound, preview
from memory_service.schemas.keys import Role
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

AccessMode = Literal["keys", "open"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_mode(setting: str, host: str | None) -> AccessMode:
    """API_AUTH=auto means keys unless the server is known to listen on loopback only."""
    if setting == "off":
        return "open"
    if setting == "keys":
        return "keys"
    return "open" if host is not None and is_loopback(host) else "keys"


def authorize(principal: Principal, role: Role, agent_id: str, user_id: str | None = None) -> None:
    """403 unless ``principal`` may act as ``role`` on ``agent_id`` (for ``user_id``)."""
    if principal.allows(role, agent_id, user_id):
        return
    if not principal.reaches(agent_id):
        raise Forbidden(f"this API key does not reach agent {preview(agent_id)}")
    if role.rank > principal.role.rank:
        raise Forbidden(f"this API key's role is {principal.role.value}; this needs {role.value}")
    if user_id is None:
        raise Forbidden(f"this API key is limited to some users of agent {preview(agent_id)}; this needs a key for "
                        "all of them")
    raise Forbidden(f"this API key is limited to some users of agent {preview(agent_id)}, and {preview(user_id)} is "
                    "not one of them")


def authorize_users(principal: Principal, role: Role, agent_id: str,
                    user_ids: Sequence[str | None]) -> list[Forbidden | None]:
    """For a request acting for several users of ``agent_id`` at once (a batch of messages):
    403 (raised) unless ``principal`` may act as ``role`` on the agent at all; then, per user
    id, the refusal ``authorize`` would raise for it, or None (None ids: not checked). Raised
    too when every user is refused: a request the key may do nothing of is refused whole."""
    if role.rank > principal.role.rank or not principal.reaches(agent_id):
        authorize(principal, role, agent_id)  # says which
    refusals: list[Forbidden | None] = []
    for user_id in user_ids:
        try:
            if user_id is not None:
                authorize(principal, role, agent_id, user_id)
            refusals.append(None)
        except Forbidden as refused:
            refusals.append(refused)
    if refusals and all(refused is not None for refused in refusals):
        raise cast(Forbidden, refusals[0])
    return refusals


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise Forbidden("this needs an operator key (role admin over every agent)")


async def authorize_session(state: StateStore, principal: Principal, session_id: str, role: Role) -> None:
    """Authorize a route named by a session id alone, by the agent that owns the session.

    An unknown session, a session the key does not reach and (for a key limited to some
    users) a session none of its users took part in get the same 404, so that a key cannot
    learn which session ids others use.
    """
    if principal.is_operator:
        return  # the service answers an unknown session itself
    owner = (await state.counters(session_id)).agent_id
    if owner is None or not principal.reaches(owner) or \
            not await Reach.of(state, owner, principal.users).sees_owned_session(session_id, owner):
        raise NotFound(f"session {preview(session_id)} has no recorded messages")
    authorize(principal, role, owner, min(principal.users) if principal.users else None)
