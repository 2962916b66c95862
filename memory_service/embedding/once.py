"""Stored memories embedded once: claim, embed, renew, write, release (every path that
embeds what was stored without its vector: the record-time run, the embedding job, the backfill).

A memory is embedded by the one caller that claimed it (memory_service/state/embed_claims.py);
a memory another caller holds is skipped and named back (``busy``), so a reader can look past
it. The model is called in turns of the embedder's batch size (the local model runs one call
at a time: a formation job's embedding waits behind one turn, not the whole read). The claims
are renewed every third of the lease while the caller works, in the background: one turn of
long texts on a loaded machine (or one waiting for its turn at the model behind callers
someone waits for) can outlast the lease, and a claim that lapsed mid-turn had its vectors
dropped and the memories embedded again, over and over. They are renewed once more before
the write, and only the vectors whose claim held are written. A written memory keeps its claim
until the lease ends (a reader whose read came just before the write must not claim it
again); a memory left unwritten (the embedder or the store failed) is released, claimable
again at once; one whose claimer died, after the lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from memory_service.backends.base import MemoryBackend
from memory_service.domain.models import Memory
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.state.embed_claims import Claim, EmbedClaims

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Embedded:
    stored: int = 0  # vectors written
    claimed: int = 0  # memories this caller claimed
    busy: list[str] = field(default_factory=list)  # ids another caller holds: skipped
    lost: int = 0  # embedded, but the claim expired before the write: not written
    failed: bool = False  # the embedder failed on a turn (it logged why); the rest was not embedded


async def embed_once(embedder: Embedder, claims: EmbedClaims, backend: MemoryBackend, agent_id: str,
                     memories: Sequence[Memory], step: int,
                     on_turn: Callable[[Sequence[Memory]], None] | None = None) -> Embedded:
    """Embed and store ``memories`` (the agent's, read as unembedded) that this caller claims.
    ``on_turn`` is told each turn's memories once the model gave them their vectors (before
    the write)."""
    claim = await claims.claim(agent_id, [m.id for m in memories])
    held = set(claim.ids)
    result = Embedded(claimed=len(held), busy=[m.id for m in memories if m.id not in held])
    written: set[str] = set()
    keeper = asyncio.create_task(_keep_renewed(claims, claim), name=f"embedding claims of {agent_id}")
    try:
        written = await _embed_and_write(embedder, claims, claim, backend, [m for m in memories if m.id in held],
                                         step, result, on_turn)
    finally:
        keeper.cancel()
        with suppress(asyncio.CancelledError):
            await keeper
        # What was written keeps its claim until the lease ends: a reader whose read came just
        # before the write finds it claimed. The rest is claimable again at once.
        try:
            await claims.release(claim, [i for i in claim.ids if i not in written])
        except Exception as exc:  # the claims expire after their lease
            log.warning("could not release %d embedding claims of agent %s: %s", len(claim.ids), agent_id, exc)
    return result


async def _keep_renewed(claims: EmbedClaims, claim: Claim) -> None:
    """Renew the claim's ids every third of the lease until cancelled (a renewal that fails is
    tried again at the next; the claims then hold until their lease ends)."""
    while True:
        await asyncio.sleep(claims.lease_ms / 3000)
        try:
            await claims.renew(claim)
        except Exception as exc:
            log.warning("could not renew %d embedding claims of agent %s: %s", len(claim.ids), claim.agent_id, exc)


async def _embed_and_write(embedder: Embedder, claims: EmbedClaims, claim: Claim, backend: MemoryBackend,
                           todo: list[Memory], step: int, result: Embedded,
                           on_turn: Callable[[Sequence[Memory]], None] | None) -> set[str]:
    """Embed ``todo`` in turns and write the vectors whose claim held; the ids written."""
    done: list[Memory] = []
    while todo:
        turn, todo = todo[:step], todo[step:]
        if not await embed_memories(embedder, turn):
            result.failed = True
            break
        done += turn
        if on_turn is not None:
            on_turn(turn)
    vectors: dict[str, list[float]] = {}
    if done:
        held = await claims.renew(claim, [m.id for m in done])
        vectors = {m.id: m.embedding for m in done if m.id in held and m.embedding is not None}
        result.lost += len(done) - len(vectors)
        result.stored = await backend.set_embeddings(claim.agent_id, vectors, model=embedder.name)
    if result.lost:
        log.warning("%d embedding claims of agent %s expired before their write (an embedder slower than "
                    "EMBEDDING_CLAIM_SECONDS?): those vectors are dropped, the memories are embedded again",
                    result.lost, claim.agent_id)
    return set(vectors)
