"""The ``xinf_kv`` logger. The engines configure their own loggers only, so with
``XINF_KV_LOG`` set (``info``, ``debug``, …) this one gets a handler of its own."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("xinf_kv")
if os.environ.get("XINF_KV_LOG") and not log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s xinf_kv: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(os.environ["XINF_KV_LOG"].upper())
    log.propagate = False
