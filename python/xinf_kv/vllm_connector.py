"""``XinfConnector``: vLLM 0.26 as a prefill or decode replica of xinf (KV connector v1).

Selected with ``--kv-transfer-config`` ``{"kv_connector": "XinfConnector",
"kv_connector_module_path": "xinf_kv.vllm_connector", "kv_role": "kv_producer" | "kv_consumer"
| "kv_both", "kv_connector_extra_config": {"page_ip": "10.0.0.5"}}`` (``page_ip``: where this
host's page server listens, loopback by default).

The scheduler side (``vllm_state.SchedulerState``) decides; the worker side moves bytes
through ``xinf_kv._native``: a prefill's KV is gathered into staging right after the forward
that computed it and served as a room by a page server in this process (``PageHost``); a
decode's KV is fetched and scattered into the blocks vLLM allocated, in the background
(``PageLoader``), and reported through ``get_finished``; or, when the engine has nothing else
to run, synchronously: ``start_load_kv`` waits for it before the step's forward, which saves
vLLM's idle iterations (see ``vllm_state``). Only the per-request hooks are used, never the
per-layer ones, so CUDA graphs need no change.

Rules vLLM imposes, kept here: no scheduler hook raises (an exception stops EngineCore); a
failed load is reported by its block ids, and an asynchronous one's request still in
``finished_recving``; a synchronous load's request never is (vLLM runs it already); no request
id is reported twice.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)

from xinf_kv import vllm_layout
from xinf_kv.log import log
from xinf_kv.vllm_state import Meta, SchedulerState


#: Time limit of one load's fetch, in milliseconds.
LOAD_TIMEOUT_MS = int(os.environ.get("XINF_KV_LOAD_TIMEOUT_MS", "30000"))
#: The same for a synchronous load, which holds up the engine's step: past it the request's
#: prompt is recomputed instead.
SYNC_LOAD_TIMEOUT_MS = int(os.environ.get("XINF_KV_SYNC_LOAD_TIMEOUT_MS", "2000"))
#: Loads are synchronous while at most this many other requests are live on the engine
#: (-1: never).
SYNC_LOAD_MAX_LIVE = int(os.environ.get("XINF_KV_SYNC_LOAD_MAX_LIVE", "0"))
#: Loads of more tokens than this are asynchronous whatever the engine's load.
SYNC_LOAD_MAX_TOKENS = int(os.environ.get("XINF_KV_SYNC_LOAD_MAX_TOKENS", "8192"))
#: How long past its fetch's time limit a synchronous load may still take to scatter.
SYNC_SCATTER_GRACE_S = 30.0


@dataclass
class XinfMetadata(KVConnectorMetadata):
    """One step's saves and loads, scheduler side to worker side."""

    meta: Meta


@dataclass
class XinfHandshake(KVConnectorHandshakeMetadata):
    """Where a worker's page server is (worker side to scheduler side, once)."""

    endpoint: str | None
    device: str | None


# The worker's page server when the scheduler runs in the same process (one GPU), in case
# the engine hands no handshake to the scheduler side.
_LOCAL: XinfHandshake | None = None


class XinfConnector(KVConnectorBase_V1):
    """xinf's KV connector for vLLM; see the module doc."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = self._kv_transfer_config
        extra = dict(getattr(cfg, "kv_connector_extra_config", None) or {})
        self._role_name = getattr(cfg, "kv_role", "kv_both")
        self._page_ip = str(extra.get("page_ip", "127.0.0.1"))
        block_size = int(vllm_config.cache_config.block_size)
        scheduler = role == KVConnectorRole.SCHEDULER
        self._state = SchedulerState(block_size, SYNC_LOAD_MAX_LIVE, SYNC_LOAD_MAX_TOKENS) if scheduler else None
        # Worker side.
        self._layout = None
        self._regions: list[int] = []
        self._host = None
        self._loader = None
        self._device: int | None = None
        self._block_size = block_size
        self._loading: dict[str, list[int]] = {}
        # When each load started (``time.perf_counter``), for the debug timings.
        self._load_started: dict[str, float] = {}
        self._finished: set[str] = set()
        # Synchronous loads started in this step and not yet done.
        self._sync: set[str] = set()
        self._bad_blocks: set[int] = set()

    # ==== worker side =====================================================================

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        global _LOCAL
        from xinf_kv import _native

        names = vllm_layout.layer_order(list(kv_caches))
        tensors = [kv_caches[n] for n in names]
        try:
            args = vllm_layout.describe(tensors)
        except ValueError as e:
            log.error("xinf connector: %s; KV handoffs are off on this engine", e)
            return
        self._layout = _native.Layout(**args)
        self._regions = [vllm_layout.address(t) for t in tensors]
        device = tensors[0].device.index if tensors[0].is_cuda else None
        self._device = device
        if self._role_name in ("kv_producer", "kv_both"):
            self._host = _native.PageHost(self._page_ip, device)
            _LOCAL = XinfHandshake(self._host.endpoint, self._host.kv_device)
        if self._role_name in ("kv_consumer", "kv_both"):
            self._loader = _native.PageLoader(device)
        log.info(
            "xinf connector: %s over %d layers%s",
            self._layout,
            len(tensors),
            f", rooms served at {self._host.endpoint}" if self._host else "",
        )

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        if self._host is None:
            return None
        return XinfHandshake(self._host.endpoint, self._host.kv_device)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None:
            return
        for load in meta.loads:
            self._loading[load.request_id] = self._load_blocks(load.block_ids, load.start, load.end)
            if load.sync:
                self._sync.add(load.request_id)
            if self._loader is None or self._layout is None:
                log.error("request %s: this engine cannot load KV (no loader); recomputing", load.request_id)
                self._fail(load.request_id)
                continue
            self._load_started[load.request_id] = time.perf_counter()
            try:
                self._loader.start(
                    load.request_id,
                    load.endpoint,
                    load.room,
                    load.device,
                    self._layout,
                    self._regions,
                    load.block_ids,
                    (load.start, load.end),
                    SYNC_LOAD_TIMEOUT_MS if load.sync else LOAD_TIMEOUT_MS,
                )
            except Exception as e:  # noqa: BLE001 - a bad load must not stop the engine
                log.error("request %s: loading KV: %s", load.request_id, e)
                self._fail(load.request_id)
        if self._sync:
            self._wait_sync()

    def _wait_sync(self) -> None:
        """The step's forward reads what synchronous loads write: waits for each to be done
        (failed or not: a load that ran out of time still scatters what it fetched before it
        reports, so none writes after this returns)."""
        give_up = time.monotonic() + SYNC_LOAD_TIMEOUT_MS / 1e3 + SYNC_SCATTER_GRACE_S
        while self._sync and self._loader is not None:
            self._harvest(self._loader.wait(0.05))
            if self._sync and time.monotonic() > give_up:
                # Only a load whose task died reports nothing: nothing of it can write later.
                for request_id in list(self._sync):
                    log.error("request %s: its KV load never reported; recomputing", request_id)
                    self._fail(request_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is None or not meta.saves:
            return
        # The forward computed the KV on the current stream, and later steps reuse blocks on it:
        # the gather is queued there and nothing waits (fetches wait for it).
        stream = self._stream()
        for save in meta.saves:
            if self._host is None or self._layout is None:
                log.error("request %s: this engine cannot publish KV (no page host)", save.request_id)
                continue
            try:
                self._host.publish(
                    save.room,
                    self._layout,
                    self._regions,
                    save.block_ids,
                    save.prompt_len,
                    save.lease_ms,
                    stream=stream,
                )
            except Exception as e:  # noqa: BLE001 - a failed publish must not stop the engine
                log.error("request %s: publishing KV as room %d: %s", save.request_id, save.room, e)
                continue
            if log.isEnabledFor(logging.INFO):  # the counters are read only to be logged
                log.info("request %s: KV published as room %d; %s", save.request_id, save.room, dict(self._host.stats()))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._loader is not None:
            self._harvest(self._loader.poll())
        done, self._finished = self._finished, set()
        return None, (done or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._bad_blocks = self._bad_blocks, set()
        return bad

    def shutdown(self) -> None:
        self._host = None
        self._loader = None

    # ==== scheduler side ==================================================================

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        try:
            n = self._state.matched(
                request.request_id, request.kv_transfer_params, request.num_prompt_tokens, num_computed_tokens
            )
        except Exception as e:  # noqa: BLE001
            log.error("request %s: %s", getattr(request, "request_id", "?"), e)
            return 0, False
        return n, n > 0 and not self._state.loads_synchronously(request.request_id)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        try:
            ids = blocks.get_block_ids()
            block_ids = list(ids[0]) if ids else []
            self._state.allocated(
                request.request_id, request.kv_transfer_params, request.num_prompt_tokens, block_ids, num_external_tokens
            )
        except Exception as e:  # noqa: BLE001
            log.error("request %s: %s", getattr(request, "request_id", "?"), e)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        try:
            new = [(r.req_id, list(r.block_ids[0]) if r.block_ids else [], r.num_computed_tokens)
                   for r in scheduler_output.scheduled_new_reqs]
            c = scheduler_output.scheduled_cached_reqs
            resumed = getattr(c, "resumed_req_ids", set()) or set()
            cached = [
                (rid, (list(b[0]) if b else None), rid in resumed)
                for rid, b in zip(c.req_ids, c.new_block_ids)
            ]
            meta = self._state.step(new, cached, dict(scheduler_output.num_scheduled_tokens))
        except Exception as e:  # noqa: BLE001
            log.error("xinf connector: planning a step: %s", e)
            meta = Meta()
        return XinfMetadata(meta)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        try:
            self._learn_endpoint()
            ok = _finished_ok(request)
            return False, self._state.finished(request.request_id, ok)
        except Exception as e:  # noqa: BLE001
            log.error("request %s: %s", getattr(request, "request_id", "?"), e)
            return False, None

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        for m in metadata.values():
            if isinstance(m, XinfHandshake) and m.endpoint and self._state is not None:
                self._state.endpoint, self._state.device = m.endpoint, m.device

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return None

    # ==== helpers =========================================================================

    def _meta(self) -> Meta | None:
        if not self.has_connector_metadata():
            return None
        m = self._get_connector_metadata()
        return m.meta if isinstance(m, XinfMetadata) else None

    def _stream(self) -> int | None:
        """The raw CUDA stream the engine runs its forward on (``None``: host memory)."""
        if self._device is None:
            return None
        import torch

        return int(torch.cuda.current_stream(self._device).cuda_stream)

    def _load_blocks(self, block_ids: list[int], start: int, end: int) -> list[int]:
        b = self._block_size
        return list(block_ids[start // b : -(-end // b)])

    def _harvest(self, done: list[tuple[str, str | None]]) -> None:
        """Takes in finished loads: a failed one's blocks are reported bad; an asynchronous one
        is reported finished, a synchronous one only leaves the step's wait."""
        for request_id, error in done:
            blocks = self._loading.pop(request_id, [])
            if error is not None:
                self._bad_blocks.update(blocks)
            self._finish(request_id)
            started = self._load_started.pop(request_id, None)
            ms = -1.0 if started is None else (time.perf_counter() - started) * 1e3
            if log.isEnabledFor(logging.INFO):
                log.info("request %s: KV load %s in %.1f ms; %s", request_id, error or "done", ms, dict(self._loader.stats()))

    def _fail(self, request_id: str) -> None:
        self._load_started.pop(request_id, None)
        self._bad_blocks.update(self._loading.pop(request_id, []))
        self._finish(request_id)

    def _finish(self, request_id: str) -> None:
        if request_id in self._sync:
            self._sync.discard(request_id)
        else:
            self._finished.add(request_id)

    def _learn_endpoint(self) -> None:
        if self._state is not None and self._state.endpoint is None and _LOCAL is not None:
            self._state.endpoint, self._state.device = _LOCAL.endpoint, _LOCAL.device


def _finished_ok(request: Any) -> bool:
    """Whether the request finished by its length or a stop (not aborted or failed): only then
    is its KV complete."""
    try:
        from vllm.v1.request import RequestStatus

        return request.status in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
    except Exception:  # noqa: BLE001
        return False
