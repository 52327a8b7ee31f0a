"""The handoff fields xinf puts in a request (vLLM's ``kv_transfer_params``) and reads back.

A prefill request carries ``{"xinf": {"room": R, "lease_ms": L}}``: compute the prompt, then
publish its KV as room ``R`` for ``L`` ms. The engine's answer carries
``{"xinf": {"room": R, "endpoint": E, "device": D, "pages": n}}``: where the room is served.
A decode request carries ``{"xinf": {"fetch": {"room": R, "endpoint": E, "device": D,
"prompt_len": N}}}``: load the prompt's KV from that room instead of computing it.

Parsing never raises: the engine's scheduler calls these on its own thread, where an
exception would stop the engine. A malformed field gives ``None`` and the reason, which the
connector logs; the request is then served without a handoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Lease of a room when the request names none, in milliseconds.
DEFAULT_LEASE_MS = 30_000
#: Longest lease a request may ask for (one hour).
MAX_LEASE_MS = 3_600_000
#: Rooms are nonzero 63-bit integers (SGLang's bootstrap rooms are too).
MAX_ROOM = (1 << 63) - 1


@dataclass(frozen=True)
class PrefillParams:
    """Compute the prompt and publish its KV as ``room``."""

    room: int
    lease_ms: int


@dataclass(frozen=True)
class DecodeParams:
    """Load the prompt's KV from ``room`` at ``endpoint`` (JSON of xinf's ``Endpoint``)."""

    room: int
    endpoint: str
    device: str | None
    prompt_len: int


def _room(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ROOM:
        return None
    return value


def parse_params(params: Any) -> tuple[PrefillParams | DecodeParams | None, str | None]:
    """The xinf handoff a request's ``kv_transfer_params`` asks for, or ``None`` and why not
    (``None`` and no reason: the request asks for none)."""
    if not isinstance(params, dict) or "xinf" not in params:
        return None, None
    x = params["xinf"]
    if not isinstance(x, dict):
        return None, "kv_transfer_params.xinf must be an object"
    fetch = x.get("fetch")
    if fetch is not None:
        if not isinstance(fetch, dict):
            return None, "kv_transfer_params.xinf.fetch must be an object"
        room = _room(fetch.get("room"))
        if room is None:
            return None, "kv_transfer_params.xinf.fetch.room must be an integer in 1..2^63-1"
        endpoint = fetch.get("endpoint")
        if isinstance(endpoint, dict):
            import json

            endpoint = json.dumps(endpoint)
        if not isinstance(endpoint, str) or not endpoint:
            return None, "kv_transfer_params.xinf.fetch.endpoint must be an object"
        device = fetch.get("device")
        if isinstance(device, dict):
            import json

            device = json.dumps(device)
        if device is not None and not isinstance(device, str):
            return None, "kv_transfer_params.xinf.fetch.device must be an object or null"
        n = fetch.get("prompt_len")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return None, "kv_transfer_params.xinf.fetch.prompt_len must be a positive integer"
        return DecodeParams(room, endpoint, device, n), None
    room = _room(x.get("room"))
    if room is None:
        return None, "kv_transfer_params.xinf.room must be an integer in 1..2^63-1"
    lease = x.get("lease_ms", DEFAULT_LEASE_MS)
    if isinstance(lease, bool) or not isinstance(lease, int) or not 0 < lease <= MAX_LEASE_MS:
        return None, f"kv_transfer_params.xinf.lease_ms must be an integer in 1..{MAX_LEASE_MS}"
    return PrefillParams(room, lease), None
