"""SGLang plugin (entry point ``xinf`` of group ``sglang.srt.plugins``): adds the transfer
backend ``xinf`` (``xinf_kv.sglang_backend``) to SGLang 0.5.15 without patching it.

SGLang runs every installed plugin in each of its processes (``sglang.srt.plugins``), so this
only registers hooks and changes nothing else: a server started without
``--disaggregation-transfer-backend xinf`` behaves as before.

- ``xinf`` becomes a choice of ``--disaggregation-transfer-backend``;
- ``TransferBackend`` (a closed enum) is replaced by the same enum with ``XINF`` added (SGLang's
  hook registry rebinds the modules that imported it already);
- ``get_kv_class`` answers xinf's classes for ``XINF`` and defers to SGLang's for the rest;
- the schedulers' polls of xinf's senders and receivers skip their CPU all-reduces where the
  groups they reduce over are one process (one GPU a server): the minimum over one rank is
  its own value, and a prefill server polls a request three times before it answers.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

from xinf_kv.log import log

BACKEND = "xinf"


def register() -> None:
    from sglang.srt import server_args
    from sglang.srt.disaggregation import utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND not in server_args.DISAGG_TRANSFER_BACKEND_CHOICES:
        server_args.add_disagg_transfer_backend_choices([BACKEND])
    members = {m.name: m.value for m in utils.TransferBackend}
    if BACKEND not in members.values():
        members["XINF"] = BACKEND
        backend = enum.Enum("TransferBackend", members, module=utils.__name__)
        HookRegistry.register("sglang.srt.disaggregation.utils.TransferBackend", backend, HookType.REPLACE)
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", get_kv_class, HookType.AROUND)
    for name, hook in [("poll_and_all_reduce", poll_one_group), ("poll_and_all_reduce_attn_cp_tp_group", poll_tp_cp)]:
        HookRegistry.register(f"sglang.srt.disaggregation.utils.{name}", functools.partial(hook, utils), HookType.AROUND)


def get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    """xinf's class of ``class_type`` when the backend is ``xinf``, else SGLang's."""
    if getattr(transfer_backend, "value", transfer_backend) != BACKEND:
        return original(transfer_backend, class_type)
    from sglang.srt.disaggregation.base.conn import KVArgs

    from xinf_kv import sglang_backend as b

    return {
        "kvargs": KVArgs,
        "manager": b.XinfKVManager,
        "sender": b.XinfKVSender,
        "receiver": b.XinfKVReceiver,
        "bootstrap_server": b.XinfBootstrapServer,
    }.get(getattr(class_type, "value", class_type))


# Whether a poll has been taken without its all-reduces yet (logged once a process).
_SKIPPED = False


def _ours_alone(pollers: Any, *groups: Any) -> bool:
    """Whether every poller is xinf's and every group one process: then the all-reduces of a
    poll would return the polls as they are."""
    global _SKIPPED
    import torch.distributed as dist

    from xinf_kv import sglang_backend as b

    alone = (
        bool(pollers)
        and all(isinstance(p, (b.XinfKVSender, b.XinfKVReceiver)) for p in pollers)
        and all(g is not None and dist.get_world_size(group=g) == 1 for g in groups)
    )
    if alone and not _SKIPPED:
        _SKIPPED = True
        log.info("polls of xinf's transfers skip their all-reduces (every group is one process)")
    return alone


def poll_one_group(
    utils: Any,
    original: Any,
    pollers: Any,
    gloo_group: Any,
    decode_reqs: Any = None,
    metadata_buffers: Any = None,
    server_args: Any = None,
) -> Any:
    """SGLang's ``poll_and_all_reduce`` (a decode server's polls) without its all-reduce where
    ``_ours_alone``: the same polls (failure injection included) and the same metadata gate."""
    if not _ours_alone(pollers, gloo_group):
        return original(pollers, gloo_group, decode_reqs, metadata_buffers, server_args)
    polls = utils._poll_with_failure_injection(pollers)
    if decode_reqs is not None and metadata_buffers is not None and server_args is not None:
        utils._apply_metadata_gate(polls, decode_reqs, metadata_buffers, server_args)
    return [int(p) for p in polls]


def poll_tp_cp(utils: Any, original: Any, pollers: Any, attn_cp_cpu_group: Any, attn_tp_cpu_group: Any) -> Any:
    """SGLang's ``poll_and_all_reduce_attn_cp_tp_group`` (a prefill server's polls) without its
    two all-reduces where ``_ours_alone``."""
    if not _ours_alone(pollers, attn_cp_cpu_group, attn_tp_cpu_group):
        return original(pollers, attn_cp_cpu_group, attn_tp_cpu_group)
    return [int(p) for p in utils._poll_with_failure_injection(pollers)]
