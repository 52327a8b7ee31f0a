"""SGLang plugin (entry point ``xinf`` of group ``sglang.srt.plugins``): adds the transfer
backend ``xinf`` (``xinf_kv.sglang_backend``) to SGLang 0.5.15 without patching it.

SGLang runs every installed plugin in each of its processes (``sglang.srt.plugins``), so this
only registers hooks and changes nothing else: a server started without
``--disaggregation-transfer-backend xinf`` behaves as before.

- ``xinf`` becomes a choice of ``--disaggregation-transfer-backend``;
- ``TransferBackend`` (a closed enum) is replaced by the same enum with ``XINF`` added (SGLang's
  hook registry rebinds the modules that imported it already);
- ``get_kv_class`` answers xinf's classes for ``XINF`` and defers to SGLang's for the rest.
"""

from __future__ import annotations

import enum
from typing import Any

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
