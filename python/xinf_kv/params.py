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


# ==== SGLang: the handoff travels in the bootstrap address ==================================
#
# SGLang's requests carry a prefill's whereabouts as ``bootstrap_host`` / ``bootstrap_port`` /
# ``bootstrap_room`` and hand a transfer backend nothing else. xinf owns the rendezvous, so its
# backend needs no bootstrap server: ``bootstrap_host`` is a *ticket*, ``xinf-`` followed by the
# hex of a JSON object, and the room is ``bootstrap_room``. A prefill's ticket holds
# ``{"lease_ms": L, "shape": S}``; a decode's ``{"fetch": {"endpoint": E, "device": D,
# "prompt_len": N, "first_token": T, "first_logprobs": P}, "shape": S}`` (SGLang's decode appends
# the prefill's first token itself, so it travels with the room; ``P``, where the request asked
# for log-probabilities, is ``{"logprob": x, "top": [[id, x], ...]}``, which SGLang reports
# with that token). ``S`` is
# ``{"layers", "kv_heads", "head_dim", "elem_bytes"}``: the engine's transfer arguments give
# only byte sizes.

#: What starts a ticket (no ``:``, so SGLang never reads it as an IPv6 address).
TICKET_PREFIX = "xinf-"
#: Longest ticket accepted, in characters.
MAX_TICKET = 16_384


@dataclass(frozen=True)
class KvShape:
    """The model's KV shape: layers, KV heads, head size and bytes per element."""

    layers: int
    kv_heads: int
    head_dim: int
    elem_bytes: int


@dataclass(frozen=True)
class SglangPrefill:
    """A prefill ticket: publish the prompt's KV as ``room`` for ``lease_ms``."""

    room: int
    lease_ms: int
    shape: KvShape


@dataclass(frozen=True)
class FirstLogprobs:
    """The first token's log-probability and the most likely tokens' ``(id, logprob)``, as the
    prefill side reported them."""

    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SglangDecode:
    """A decode ticket: load the prompt's KV from the room; ``first_token`` is the prefill's,
    with its log-probabilities where the request asked for them."""

    fetch: DecodeParams
    first_token: int
    shape: KvShape
    first_logprobs: FirstLogprobs | None = None


#: The most alternatives a ticket's first token may carry (SGLang's own limit is lower).
MAX_TOP_LOGPROBS = 1024


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _first_logprobs(value: Any) -> tuple[FirstLogprobs | None, str | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict) or not _number(value.get("logprob")):
        return None, "the xinf ticket's fetch.first_logprobs must hold a logprob number"
    top = value.get("top", [])
    if not isinstance(top, list) or len(top) > MAX_TOP_LOGPROBS:
        return None, f"the xinf ticket's fetch.first_logprobs.top must be a list of at most {MAX_TOP_LOGPROBS}"
    pairs = []
    for t in top:
        if not (isinstance(t, list) and len(t) == 2 and isinstance(t[0], int) and not isinstance(t[0], bool)
                and 0 <= t[0] < 1 << 31 and _number(t[1])):
            return None, "the xinf ticket's fetch.first_logprobs.top must hold [token id, logprob] pairs"
        pairs.append((t[0], float(t[1])))
    return FirstLogprobs(float(value["logprob"]), tuple(pairs)), None


def make_ticket(fields: dict) -> str:
    """The ``bootstrap_host`` carrying ``fields``."""
    import json

    return TICKET_PREFIX + json.dumps(fields, separators=(",", ":")).encode().hex()


def _shape(value: Any) -> KvShape | None:
    if not isinstance(value, dict):
        return None
    out = []
    for k in ("layers", "kv_heads", "head_dim", "elem_bytes"):
        v = value.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 20:
            return None
        out.append(v)
    return KvShape(*out)


def parse_ticket(host: Any, room: Any) -> tuple[SglangPrefill | SglangDecode | None, str | None]:
    """The handoff an SGLang request's ``bootstrap_host`` and ``bootstrap_room`` ask for, or
    ``None`` and why not. Never raises."""
    import json

    if not isinstance(host, str) or not host.startswith(TICKET_PREFIX):
        return None, "the bootstrap host is not an xinf ticket (route requests through xinf)"
    if len(host) > MAX_TICKET:
        return None, f"an xinf ticket of {len(host)} characters (at most {MAX_TICKET})"
    try:
        fields = json.loads(bytes.fromhex(host[len(TICKET_PREFIX) :]).decode())
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"the xinf ticket does not decode: {e}"
    if not isinstance(fields, dict):
        return None, "the xinf ticket must hold an object"
    shape = _shape(fields.get("shape"))
    if shape is None:
        return None, "the xinf ticket's shape must hold positive layers, kv_heads, head_dim, elem_bytes"
    fetch = fields.get("fetch")
    if fetch is None:
        parsed, why = parse_params({"xinf": {"room": room, "lease_ms": fields.get("lease_ms", DEFAULT_LEASE_MS)}})
        if parsed is None:
            return None, _in_ticket(why)
        return SglangPrefill(parsed.room, parsed.lease_ms, shape), None
    if not isinstance(fetch, dict):
        return None, "the xinf ticket's fetch must be an object"
    parsed, why = parse_params({"xinf": {"fetch": dict(fetch, room=room)}})
    if parsed is None:
        return None, _in_ticket(why)
    first = fetch.get("first_token")
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < 1 << 31:
        return None, "the xinf ticket's fetch.first_token must be a token id"
    logprobs, why = _first_logprobs(fetch.get("first_logprobs"))
    if why is not None:
        return None, why
    return SglangDecode(parsed, first, shape, logprobs), None


def _in_ticket(why: str | None) -> str:
    """A reason of ``parse_params`` in the words of a ticket."""
    why = why or "a bad ticket"
    for old, new in (
        ("kv_transfer_params.xinf.fetch.room", "bootstrap_room"),
        ("kv_transfer_params.xinf.room", "bootstrap_room"),
        ("kv_transfer_params.xinf.fetch.", "the xinf ticket's fetch."),
        ("kv_transfer_params.xinf.", "the xinf ticket's "),
    ):
        why = why.replace(old, new)
    return why
