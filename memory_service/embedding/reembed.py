"""The re-embed: every memory of an agent given a vector of a new model, online, and the
switch to that model once all of them have one (``memory-service reembed``).

Why this shape (docs/embeddings.md, "Changing the model"): each vector carries the name of
the model that made it and search compares a query only with vectors of its own model, so
two models are never mixed; but a service that still runs the old model must keep finding
memories by vector while the new model's vectors are computed, which takes hours on a large
store. So the new vectors are *staged* beside the searched ones (the stores'
``stage_embeddings``), and only when every memory of the agent has one are they *promoted*
(``promote_embeddings``: a copy inside the store, no model call, quick) and the agent
switches. The model is the embedder this process runs: configure the new model
(``EMBEDDER``, ``EMBEDDING_MODEL``) for the command, not for the running service.

Resumable: the agent's record in Redis (``keyspace.reembed``) holds the target model, the
cursor of the pass and the counts, saved after every page; a run that stops (interrupted,
the embedder down, a page budget) is continued by the next run for the same model. The
stores' own state makes it safe whatever happens to the record: a memory that has a vector
of the model, searched or staged, is never a candidate again.

Passes: one scan in the store's order from the cursor, then sweeps from the start until a
sweep finds nothing, which catches memories written behind the cursor meanwhile (by the
running service). A service still running the old model keeps writing vectors of it; after
``MAX_SWEEPS`` the staged vectors are promoted anyway and the summary says how many
memories are left, which a later run (once every process runs the new model) converts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memory_service.backends.base import MemoryBackend
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.turns import backlog
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

MAX_SWEEPS = 5  # passes from the start, after the scan, before the staged vectors are promoted anyway
PROMOTE_BATCH = 1000  # staged vectors made the searched ones per statement


@dataclass
class AgentReembed:
    """What a run did for one agent."""

    agent_id: str
    staged: int = 0  # vectors of the new model staged by this run
    promoted: int = 0  # staged vectors made the searched ones by this run
    switched: bool = False  # every memory has a vector of the model now: the agent switched
    left: int = 0  # memories still without a vector of the model after the switch (at least)
    stopped: str | None = None  # why the run stopped before the switch ("the embedder failed: ...")


@dataclass
class ReembedReport:
    model: str
    agents: list[AgentReembed] = field(default_factory=list)
    deployment_switched: bool = False  # every agent switched: the store's model is this one

    @property
    def complete(self) -> bool:
        return all(a.switched for a in self.agents)


# on_progress(agent_id, phase ("stage" or "promote"), how many more were done)
ReembedProgress = Callable[[str, str, int], None]


class Reembedder:
    """Re-embeds agents' memories with ``embedder`` (the new model) and switches them."""

    def __init__(self, state: StateStore, embedder: Embedder, batch: int = 64):
        self.state, self.embedder, self.batch = state, embedder, batch

    @property
    def model(self) -> str:
        return self.embedder.name

    async def run(self, agents: Sequence[tuple[str, MemoryBackend]], *, budget: int | None = None,
                  on_progress: ReembedProgress | None = None, all_agents: Sequence[str] | None = None) -> ReembedReport:
        """Re-embed ``agents`` (id, the agent's backend) one after the other. ``budget``: stop
        after staging that many vectors (the record keeps the place). ``all_agents``: every
        agent of the store; when each has switched to the model, the store's model switches."""
        report = ReembedReport(self.model)
        left = budget
        for agent_id, backend in agents:
            done = await self.run_agent(agent_id, backend, budget=left, on_progress=on_progress)
            report.agents.append(done)
            if left is not None:
                left -= done.staged
            if done.stopped is not None:
                break
        if all_agents is not None and report.complete:
            models = [(await self.state.reembed_state(a)).get("model") for a in all_agents]
            if all(m == self.model for m in models):
                await self.state.switch_embedder(self.model)
                report.deployment_switched = True
        return report

    async def run_agent(self, agent_id: str, backend: MemoryBackend, *, budget: int | None = None,
                        on_progress: ReembedProgress | None = None) -> AgentReembed:
        done = AgentReembed(agent_id)
        record = await self.state.reembed_state(agent_id)
        if record.get("target") != self.model:  # a new run (or one for another model: started over)
            record = {"target": self.model, "pass": "scan", "cursor": "", "sweeps": "0", "staged": "0",
                      "started_at": str(time.time())}
            await self.state.set_reembed_state(agent_id, **record)
        phase, cursor, sweeps = record["pass"], record.get("cursor") or None, int(record.get("sweeps", "0"))
        found_in_sweep = 1 if phase == "sweep" and cursor else 0  # resumed inside a sweep: one more after it
        while phase in ("scan", "sweep"):
            if budget is not None and done.staged >= budget:
                done.stopped = f"stopped after {done.staged} vectors as asked; run again to continue"
                return done
            page, following = await backend.reembed_candidates(agent_id, self.model, cursor, self.batch)
            if page:
                try:
                    with backlog():  # the model gives way to searches and formation between runs
                        vectors = await self.embedder.embed([text for _, text in page])
                except Exception as exc:  # EmbedderUnavailable, or any failure of the model: stop, resumable
                    done.stopped = f"the embedder failed: {exc}"
                    log.warning("re-embed of agent %s stopped: %s", agent_id, done.stopped)
                    return done
                staged = await backend.stage_embeddings(
                    agent_id, self.model, {memory_id: (text, vector) for (memory_id, text), vector in zip(page, vectors)})
                done.staged += staged
                found_in_sweep += len(page)
                if on_progress:
                    on_progress(agent_id, "stage", staged)
            if following is not None:
                cursor = following
            elif phase == "scan" or (found_in_sweep and sweeps < MAX_SWEEPS):
                # From the start again: memories written behind the cursor meanwhile.
                phase, cursor, sweeps, found_in_sweep = "sweep", None, sweeps + (phase == "sweep"), 0
            else:
                phase = "promote"
            progress: dict[str, str | int] = {"pass": phase, "cursor": cursor or "", "sweeps": sweeps,
                                              "staged": int(record.get("staged", "0")) + done.staged}
            await self.state.set_reembed_state(agent_id, **progress)
        while promoted := await backend.promote_embeddings(agent_id, self.model, PROMOTE_BATCH):
            done.promoted += promoted
            if on_progress:
                on_progress(agent_id, "promote", promoted)
        left, _ = await backend.reembed_candidates(agent_id, self.model, None, self.batch)
        done.left, done.switched = len(left), True
        await self.state.set_reembed_state(agent_id, model=self.model, switched_at=time.time(), target=None,
                                           cursor=None, sweeps=None, staged=None, started_at=None, **{"pass": None})
        log.info("agent %s switched to %s: %d vectors staged and %d promoted by this run, %d memories left",
                 agent_id, self.model, done.staged, done.promoted, done.left)
        return done
