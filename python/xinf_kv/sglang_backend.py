"""xinf's SGLang transfer backend: ``--disaggregation-transfer-backend xinf``.

SGLang 0.5.15 runs a prefill server (``--disaggregation-mode prefill``) and a decode server
(``decode``) and moves a request's KV between them through a transfer backend: a manager per
scheduler, a sender per prefill request, a receiver per decode request. This is one that
speaks xinf's page plane, so the other side may be vLLM, xinf's native engine or SGLang:

- **prefill** (sender): when the last chunk of the prompt is computed, its KV (SGLang's token
  pool: per layer a K and a V buffer of ``(slots, H, D)``, page size 1) is gathered into
  staging and published as room ``bootstrap_room`` by a page server in this process
  (``xinf_kv._native.PageHost``); then the request may finish and free its slots. The room is
  served until xinf releases it or its lease ends.
- **decode** (receiver): once SGLang has reserved slots for the prompt, the room is fetched
  (GPU to GPU by CUDA IPC on one host) and scattered into those slots in the background
  (``PageLoader``); when it is in, the prefill's first token and the room are written into the
  request's metadata row, which is what SGLang's decode reads before it goes on from there.

No bootstrap server is needed: xinf owns the rendezvous and hands each side a ticket in
``bootstrap_host`` (``xinf_kv.params.parse_ticket``). Where this process's page server is, xinf
reads from the file named by ``XINF_KV_ENDPOINT_FILE``, written at start; it listens on
``XINF_KV_HOST`` (loopback by default).

Rules SGLang imposes, kept here: an exception in scheduler code stops the server, so no
per-request method raises; a failure is reported as ``KVPoll.Failed`` with its reason in
``failure_exception``. A receiver aborted while its pages are in flight stays ``Transferring``
until the scatter is over, so SGLang never frees slots that are still being written. Only page
size 1 and plain attention KV (no MLA, no recurrent state) are served; a server started
otherwise fails at start, naming why.

This module imports nothing from SGLang (the plugin, ``xinf_kv.sglang_plugin``, does), so its
logic is tested without SGLang installed.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from xinf_kv.log import log
from xinf_kv.params import KvShape, SglangDecode, SglangPrefill, parse_ticket

#: SGLang's ``KVPoll`` (``sglang/srt/disaggregation/base/conn.py``).
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = 0, 1, 2, 3, 4

#: Time limit of one load, in milliseconds.
LOAD_TIMEOUT_MS = int(os.environ.get("XINF_KV_LOAD_TIMEOUT_MS", "30000"))

#: SGLang's metadata buffers, in ``MetadataBuffers.get_buf_infos`` order: the receiver writes
#: the first token into ``output_ids``, zeroes ``cached_tokens``, writes the first token's
#: log-probabilities (``output_token_logprobs_val``/``_idx``, ``output_top_logprobs_val``/
#: ``_idx``: float32 and int32 rows; SGLang's decode reads them for a request that asked) and
#: sets ``bootstrap_room``.
_OUTPUT_IDS, _CACHED_TOKENS, _BOOTSTRAP_ROOM, _AUX_BUFFERS = 0, 1, 9, 10
_LOGPROB_VAL, _LOGPROB_IDX, _TOP_VAL, _TOP_IDX = 2, 3, 4, 5


@dataclass
class TransferMetric:
    """What SGLang's ``KVTransferMetric`` holds (it reads these attributes)."""

    transfer_latency_s: float | None = None
    alloc_latency_s: float | None = None
    transfer_total_bytes: int | None = None


class _OnePrefill:
    """What SGLang's decode looks up about a prefill server: with xinf, always one rank."""

    dp_size = 1
    follow_bootstrap_room = False


class _EveryPrefill(dict):
    """``prefill_info_table``: every bootstrap address is known (it is a ticket)."""

    def get(self, key: Any, default: Any = None) -> Any:
        return _OnePrefill()


class XinfBootstrapServer:
    """SGLang starts a bootstrap server on the prefill side; xinf's tickets need none."""

    def __init__(self, host: str = "", port: int = 0, **_: Any) -> None:
        self.host, self.port = host, port

    def close(self) -> None:
        return


def _mode(mode: Any) -> str:
    return str(getattr(mode, "value", mode)).lower()


class XinfKVManager:
    """One scheduler's side of the page plane: a page server (prefill) or a loader (decode)
    over SGLang's token pool. Refuses, at start, what it cannot move."""

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any = None, is_mla_backend: bool = False):
        from xinf_kv import _native

        self.kv_args = args
        self.mode = _mode(disaggregation_mode)
        self.prefill_info_table = _EveryPrefill()
        if is_mla_backend:
            raise ValueError("xinf's transfer backend moves multi-head attention KV; this model's is MLA")
        page_size = int(getattr(args, "page_size", 1) or 1)
        if page_size != 1:
            raise ValueError(f"xinf's transfer backend needs --page-size 1 (this server has {page_size})")
        if list(getattr(args, "state_types", None) or []):
            raise ValueError("xinf's transfer backend moves attention KV only; this model keeps other state")
        ptrs, lens, items = list(args.kv_data_ptrs), list(args.kv_data_lens), list(args.kv_item_lens)
        if not ptrs or len(ptrs) % 2 or len(lens) != len(ptrs) or len(items) != len(ptrs):
            raise ValueError(f"{len(ptrs)} KV buffers (SGLang gives a K and a V buffer per layer)")
        if len(set(items)) != 1 or len(set(lens)) != 1 or lens[0] % items[0]:
            raise ValueError("KV buffers of different sizes (more than one model's cache?)")
        self.layers = len(ptrs) // 2
        # SGLang lists every layer's K, then every layer's V; xinf's pool layout takes them in pairs.
        self.regions = [a for layer in zip(ptrs[: self.layers], ptrs[self.layers :]) for a in layer]
        self.slots = lens[0] // items[0]
        self.row_bytes = items[0]
        aux = list(getattr(args, "aux_data_ptrs", None) or [])
        if self.mode == "decode" and len(aux) != _AUX_BUFFERS:
            raise ValueError(f"{len(aux)} metadata buffers (SGLang 0.5.15 has {_AUX_BUFFERS})")
        gpu = getattr(args, "gpu_id", None)
        self.device = None if gpu is None else int(gpu)
        self._layouts: dict[KvShape, Any] = {}
        self._done: dict[str, str | None] = {}
        self.host = None
        self.loader = None
        if self.mode == "prefill":
            self.host = _native.PageHost(os.environ.get("XINF_KV_HOST", "127.0.0.1"), self.device)
            self._announce()
        elif self.mode == "decode":
            self.loader = _native.PageLoader(self.device)
        log.info("xinf transfer backend (%s): %d layers, %d slots of %d bytes", self.mode, self.layers, self.slots, self.row_bytes)

    def _announce(self) -> None:
        """Writes where this page server is to ``XINF_KV_ENDPOINT_FILE`` (atomically)."""
        path = os.environ.get("XINF_KV_ENDPOINT_FILE")
        if not path:
            log.warning("XINF_KV_ENDPOINT_FILE is not set: xinf cannot learn where this server's rooms are")
            return
        device = self.host.kv_device
        text = json.dumps({"endpoint": json.loads(self.host.endpoint), "device": json.loads(device) if device else None})
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    # What SGLang calls on a manager.
    def register_to_bootstrap(self) -> None:
        return

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        return True

    # For the senders and receivers.
    def layout(self, shape: KvShape) -> Any:
        """The pool's layout for a model of ``shape``; ``ValueError`` when the shape does not
        fit this server's buffers."""
        cached = self._layouts.get(shape)
        if cached is not None:
            return cached
        if shape.layers != self.layers:
            raise ValueError(f"a room of {shape.layers} layers for a server of {self.layers}")
        row = shape.kv_heads * shape.head_dim * shape.elem_bytes
        if row != self.row_bytes:
            raise ValueError(
                f"{shape.kv_heads} KV heads of {shape.head_dim} × {shape.elem_bytes} bytes for slots of "
                f"{self.row_bytes} bytes"
            )
        from xinf_kv import _native

        layout = _native.Layout("token-pool", 1, shape.layers, shape.kv_heads, shape.head_dim, self.slots, shape.elem_bytes)
        self._layouts[shape] = layout
        return layout

    def finished(self, key: str) -> tuple[bool, str | None]:
        """Whether the load ``key`` is over, and its error if it failed."""
        if self.loader is not None:
            for request, error in self.loader.poll():
                self._done[request] = error
        if key in self._done:
            return True, self._done.pop(key)
        return False, None


def _ticket(bootstrap_addr: Any, room: Any) -> tuple[Any, str | None]:
    host = bootstrap_addr.rsplit(":", 1)[0] if isinstance(bootstrap_addr, str) else bootstrap_addr
    return parse_ticket(host, room)


class _Side:
    """What a sender and a receiver share: a state SGLang polls, and a failure kept with its
    reason for ``failure_exception`` (raising it is SGLang's own doing, outside its loop)."""

    room: Any = None
    _error: str | None = None
    _state: int = WAITING_FOR_INPUT
    conclude_state: int | None = None

    def _fail(self, why: str) -> None:
        if self._error is None:
            self._error = why
            if why != "aborted":
                log.error("room %s: %s", self.room, why)
        self._state = self.conclude_state = FAILED

    def poll(self) -> int:
        return self._state

    def failure_exception(self) -> None:
        raise RuntimeError(self._error or "xinf transfer failed")

    def clear(self) -> None:
        return


class XinfKVSender(_Side):
    """A prefill request's KV: published as a room once its last chunk is computed."""

    def __init__(self, mgr: XinfKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: Any = None, pp_rank: int = 0):
        self.kv_mgr = mgr
        self.room = bootstrap_room
        self._slots: list[int] = []
        self._last = False
        self._error: str | None = None
        self._published = False
        self._state = WAITING_FOR_INPUT
        self._metric = TransferMetric()
        ticket, why = _ticket(bootstrap_addr, bootstrap_room)
        self._ticket = ticket if isinstance(ticket, SglangPrefill) else None
        if self._ticket is None:
            self._fail(why or "a decode's ticket sent to a prefill server")

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        return

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        # The only way a sender learns which chunk is the last.
        self._last = bool(last_chunk)
        return num_pages > 0 or self._last

    def send(self, kv_indices: Any, state_indices: Any = None) -> None:
        if self._state != WAITING_FOR_INPUT:
            return
        try:
            # An array's `tolist` gives Python ints in one call (a long prompt's slots one by one
            # took a fraction of a millisecond before the answer).
            self._slots.extend(kv_indices.tolist() if hasattr(kv_indices, "tolist") else map(int, kv_indices))
            if not self._last:
                return
            t = self._ticket
            start = time.perf_counter()
            layout = self.kv_mgr.layout(t.shape)
            if self.kv_mgr.host is None:
                raise RuntimeError("this server is not a prefill server")
            # SGLang calls this after waiting for the batch's results (`copy_done`), so the KV
            # is written: the gather need not wait for the next batch, already queued when the
            # overlap scheduler processes this one.
            pages = self.kv_mgr.host.publish(
                t.room, layout, self.kv_mgr.regions, self._slots, len(self._slots), t.lease_ms, kv_ready=True
            )
            self._published = True
            self._metric = TransferMetric(time.perf_counter() - start, None, pages * layout.page_bytes)
            self._state = SUCCESS
            ms = self._metric.transfer_latency_s * 1e3
            if log.isEnabledFor(logging.INFO):  # the counters are read only to be logged
                log.info("room %d: %d tokens published in %.1f ms; %s", t.room, len(self._slots), ms, dict(self.kv_mgr.host.stats()))
        except Exception as e:  # noqa: BLE001 - an exception here would stop the server
            self._fail(f"publishing KV: {e}")

    def get_transfer_metric(self) -> TransferMetric:
        return self._metric

    def abort(self) -> None:
        if self._published and self.kv_mgr.host is not None:
            self.kv_mgr.host.release(self.room)
        self._fail("aborted")


class XinfKVReceiver(_Side):
    """A decode request's KV: loaded from its room into the slots SGLang reserved."""

    def __init__(self, mgr: XinfKVManager, bootstrap_addr: str, bootstrap_room: int | None = None, **_: Any):
        self.kv_mgr = mgr
        self.room = bootstrap_room
        self.require_staging = False
        self.conclude_state: int | None = None
        self._error: str | None = None
        self._aborted = False
        self._aux: int | None = None
        self._started = 0.0
        self._key = f"{bootstrap_room}/{id(self)}"
        self._state = BOOTSTRAPPING
        ticket, why = _ticket(bootstrap_addr, bootstrap_room)
        self._ticket = ticket if isinstance(ticket, SglangDecode) else None
        if self._ticket is None:
            self._fail(why or "a prefill's ticket sent to a decode server")

    def init(self, prefill_dp_rank: int = 0) -> None:
        if self._state == BOOTSTRAPPING:
            self._state = WAITING_FOR_INPUT

    def send_metadata(self, kv_indices: Any, aux_index: int | None = None, state_indices: Any = None, decode_prefix_len: int | None = None) -> None:
        if self._state != WAITING_FOR_INPUT:
            return
        try:
            t = self._ticket
            start = int(decode_prefix_len or 0)
            slots = [int(x) for x in kv_indices]
            n = t.fetch.prompt_len
            if start + len(slots) != n:
                raise ValueError(f"{start} + {len(slots)} slots for a room of a {n}-token prompt")
            if aux_index is None:
                raise ValueError("no metadata row")
            self._aux = int(aux_index)
            self._check_aux()
            mgr = self.kv_mgr
            if mgr.loader is None:
                raise RuntimeError("this server is not a decode server")
            layout = mgr.layout(t.shape)
            # Tokens below `start` are the server's own prefix: their slots are never written.
            table = [0] * start + slots
            mgr.loader.start(self._key, t.fetch.endpoint, t.fetch.room, t.fetch.device, layout, mgr.regions, table, (start, n), LOAD_TIMEOUT_MS)
            self._started = time.perf_counter()
            self._state = TRANSFERRING
        except Exception as e:  # noqa: BLE001 - an exception here would stop the server
            self._fail(f"loading KV: {e}")

    def _check_aux(self) -> None:
        a = self.kv_mgr.kv_args
        for i in (_OUTPUT_IDS, _CACHED_TOKENS, _LOGPROB_VAL, _LOGPROB_IDX, _TOP_VAL, _TOP_IDX, _BOOTSTRAP_ROOM):
            if not 0 <= self._aux or (self._aux + 1) * int(a.aux_item_lens[i]) > int(a.aux_data_lens[i]):
                raise ValueError(f"metadata row {self._aux} is outside buffer {i}")

    def _write_aux(self) -> None:
        """The row SGLang's decode reads on success: the prefill's first token, no cached
        tokens, and the room (SGLang checks it against the request's)."""
        a, row = self.kv_mgr.kv_args, self._aux
        at = [int(a.aux_data_ptrs[i]) + row * int(a.aux_item_lens[i]) for i in range(_AUX_BUFFERS)]
        ctypes.memset(at[_OUTPUT_IDS], 0, int(a.aux_item_lens[_OUTPUT_IDS]))
        ctypes.memset(at[_CACHED_TOKENS], 0, int(a.aux_item_lens[_CACHED_TOKENS]))
        ctypes.c_int32.from_address(at[_OUTPUT_IDS]).value = self._ticket.first_token
        # The first token's log-probabilities: the prefill side's where the ticket has them,
        # zeros otherwise (never what an earlier request left in the row).
        for i in (_LOGPROB_VAL, _LOGPROB_IDX, _TOP_VAL, _TOP_IDX):
            ctypes.memset(at[i], 0, int(a.aux_item_lens[i]))
        lp = self._ticket.first_logprobs
        if lp is not None:
            ctypes.c_float.from_address(at[_LOGPROB_VAL]).value = lp.logprob
            ctypes.c_int32.from_address(at[_LOGPROB_IDX]).value = self._ticket.first_token
            room = min(int(a.aux_item_lens[_TOP_VAL]), int(a.aux_item_lens[_TOP_IDX])) // 4
            top = lp.top[:room]
            (ctypes.c_float * len(top)).from_address(at[_TOP_VAL])[:] = [x for _, x in top]
            (ctypes.c_int32 * len(top)).from_address(at[_TOP_IDX])[:] = [t for t, _ in top]
        ctypes.c_uint64.from_address(at[_BOOTSTRAP_ROOM]).value = int(self.room)

    def poll(self) -> int:
        if self._state == TRANSFERRING:
            try:
                done, error = self.kv_mgr.finished(self._key)
                if done:
                    if error is not None:
                        self._fail(f"loading KV: {error}")
                    elif self._aborted:
                        self._fail("aborted")
                    else:
                        self._write_aux()
                        self._state = self.conclude_state = SUCCESS
                        ms = (time.perf_counter() - self._started) * 1e3
                        log.info("room %s: KV loaded in %.1f ms", self.room, ms)
            except Exception as e:  # noqa: BLE001
                self._fail(f"finishing the load: {e}")
        return self._state

    def abort(self) -> None:
        self._aborted = True
        if self._state != TRANSFERRING:
            # A load in flight still writes the reserved slots: the abort shows once it is over.
            self._fail("aborted")
