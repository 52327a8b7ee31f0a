"""The scheduler side of the vLLM connector as plain state, free of vLLM imports so that it
can be tested without vLLM.

vLLM calls the scheduler hooks on its engine-core thread, and an exception there stops the
engine: every method here is total (bad input is logged and ignored). The rules it keeps:

- **prefill** (a request with ``PrefillParams``): its blocks are followed through every step
  it is scheduled in; in the step that computes its last prompt token, a ``Save`` goes to the
  worker, which gathers the KV into staging once the step's forward is done, and publishes the
  room. That happens before the step's output reaches the scheduler, so by the time the
  request finishes and its blocks are freed the KV is out; ``request_finished`` never delays
  the free and answers where the room is.
- **decode** (``DecodeParams``): the prompt's KV but its last token counts as matched
  externally (vLLM recomputes the last prompt token to sample the first output, so only
  ``ceil((N - 1) / 64)`` pages are imported), loaded asynchronously into the blocks vLLM
  allocates; tokens a local prefix-cache hit already holds are not loaded again. A load is
  asked for once per request: a request preempted later recomputes instead.
- **synchronous loads when idle**: vLLM schedules a request whose load is asynchronous only
  after at least three engine iterations without a forward (start, see it finished, process
  that output), each ending in a 1 ms sleep. When no other request is live (at most
  ``sync_max_live``), the load is asked for synchronously instead: the request is scheduled in
  the same step, and the worker waits for its KV before that step's forward, which no other
  request shares. Loads of more than ``sync_max_tokens`` stay asynchronous. The choice is made
  once per ``matched`` call and copied into the ``Load``, so what vLLM acted on and what the
  worker does always agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from xinf_kv.params import DecodeParams, PrefillParams, parse_params

log = logging.getLogger("xinf_kv")


@dataclass
class Save:
    """Gather ``prompt_len`` tokens' KV from ``block_ids`` and publish it as ``room``."""

    request_id: str
    room: int
    block_ids: list[int]
    prompt_len: int
    lease_ms: int


@dataclass
class Load:
    """Load tokens ``start..end`` of ``room`` into ``block_ids`` (the request's blocks from
    token 0)."""

    request_id: str
    room: int
    endpoint: str
    device: str | None
    block_ids: list[int]
    start: int
    end: int
    #: Whether vLLM schedules the request in this same step: the worker must finish the load
    #: before the forward and never report it in ``get_finished``.
    sync: bool = False


@dataclass
class Meta:
    """What the scheduler side hands to the worker side for one step."""

    saves: list[Save] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)


@dataclass
class _Prefill:
    params: PrefillParams
    prompt_len: int
    block_ids: list[int] = field(default_factory=list)
    saved: bool = False


class SchedulerState:
    """The connector's per-request bookkeeping on vLLM's scheduler."""

    def __init__(self, block_size: int, sync_max_live: int = 0, sync_max_tokens: int = 8192) -> None:
        self.block_size = block_size
        #: Loads are synchronous while at most this many other requests are live (-1: never)...
        self.sync_max_live = sync_max_live
        #: ...and of at most this many tokens: a long prompt's fetch (over TCP from another host)
        #: could pass a synchronous load's time limit, and would then be computed.
        self.sync_max_tokens = sync_max_tokens
        self.endpoint: str | None = None
        self.device: str | None = None
        self._prefills: dict[str, _Prefill] = {}
        self._asked: set[str] = set()
        self._loads: list[Load] = []
        # Prompt tokens computed so far by each followed prefill.
        self._computed: dict[str, int] = {}
        # Requests vLLM has asked about and not finished, and those whose last ``matched``
        # answer asked for a synchronous load.
        self._live: set[str] = set()
        self._sync: set[str] = set()

    # -- hooks ---------------------------------------------------------------------------

    def matched(self, request_id: str, params: object, prompt_len: int, num_computed: int) -> int:
        """Tokens to load externally for a waiting request (0: none); whether the load is
        synchronous is then ``loads_synchronously``."""
        self._live.add(request_id)
        n = self._matched(request_id, params, prompt_len, num_computed)
        others = len(self._live) - 1
        if 0 < n <= self.sync_max_tokens and 0 <= self.sync_max_live and others <= self.sync_max_live:
            self._sync.add(request_id)
        else:
            self._sync.discard(request_id)
        return n

    def loads_synchronously(self, request_id: str) -> bool:
        """Whether the load the last ``matched`` call asked for is synchronous."""
        return request_id in self._sync

    def _matched(self, request_id: str, params: object, prompt_len: int, num_computed: int) -> int:
        handoff = self._parse(request_id, params)
        if not isinstance(handoff, DecodeParams) or request_id in self._asked:
            return 0
        # The request's prompt is the room's, or the room's and then the prefill's first
        # token, already shown to the client (xinf's `first_text`): either way vLLM computes
        # the last prompt token itself, and the room holds the KV of every token before it.
        if prompt_len not in (handoff.prompt_len, handoff.prompt_len + 1):
            log.warning(
                "request %s: the room holds %d prompt tokens, the request has %d; computing it",
                request_id,
                handoff.prompt_len,
                prompt_len,
            )
            return 0
        return max(0, prompt_len - 1 - num_computed)

    def allocated(self, request_id: str, params: object, prompt_len: int, block_ids: list[int], external: int) -> None:
        """After vLLM allocated the request's blocks (all of them, from token 0)."""
        handoff = self._parse(request_id, params)
        if isinstance(handoff, PrefillParams) and request_id not in self._prefills:
            self._prefills[request_id] = _Prefill(handoff, prompt_len)
        elif isinstance(handoff, DecodeParams) and external > 0 and request_id not in self._asked:
            self._asked.add(request_id)
            end = prompt_len - 1
            start = end - external
            sync = request_id in self._sync
            self._loads.append(
                Load(request_id, handoff.room, handoff.endpoint, handoff.device, list(block_ids), start, end, sync)
            )

    def step(
        self,
        new: list[tuple[str, list[int], int]],
        cached: list[tuple[str, list[int] | None, bool]],
        scheduled: dict[str, int],
    ) -> Meta:
        """One scheduled step: ``new`` (request, its blocks, tokens computed before), ``cached``
        (request, blocks added or its whole block list when resumed, resumed), tokens
        scheduled per request. Returns the worker's orders."""
        meta = Meta(loads=self._loads)
        self._loads = []
        computed: dict[str, int] = {}
        for request_id, block_ids, num_computed in new:
            p = self._prefills.get(request_id)
            if p is not None:
                p.block_ids = list(block_ids)
                computed[request_id] = num_computed
        for request_id, block_ids, resumed in cached:
            p = self._prefills.get(request_id)
            if p is None or block_ids is None:
                continue
            if resumed:
                p.block_ids = list(block_ids)
            else:
                p.block_ids.extend(block_ids)
        for request_id, p in self._prefills.items():
            if p.saved or request_id not in scheduled:
                continue
            done = computed.get(request_id, self._computed.get(request_id, 0)) + scheduled[request_id]
            self._computed[request_id] = done
            if done >= p.prompt_len:
                p.saved = True
                meta.saves.append(Save(request_id, p.params.room, list(p.block_ids), p.prompt_len, p.params.lease_ms))
        return meta

    def finished(self, request_id: str, ok: bool) -> dict | None:
        """The request is done; the ``kv_transfer_params`` its answer carries, if any."""
        self._asked.discard(request_id)
        self._live.discard(request_id)
        self._sync.discard(request_id)
        self._computed.pop(request_id, None)
        p = self._prefills.pop(request_id, None)
        if p is None or not p.saved or not ok:
            return None
        if self.endpoint is None:
            log.error("request %s: no page server is known for this engine; its KV cannot be fetched", request_id)
            return None
        pages = -(-p.prompt_len // 64)
        return {
            "xinf": {
                "room": p.params.room,
                "endpoint": self.endpoint,
                "device": self.device,
                "pages": pages,
                "prompt_len": p.prompt_len,
            }
        }

    # -- helpers -------------------------------------------------------------------------

    def _parse(self, request_id: str, params: object) -> PrefillParams | DecodeParams | None:
        handoff, why = parse_params(params)
        if why is not None:
            log.warning("request %s: %s; serving it without a handoff", request_id, why)
        return handoff
