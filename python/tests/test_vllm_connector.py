"""The connector class as vLLM loads it: needs vLLM installed (skipped loudly without it; the
engine runs are tests/engines/vllm_pd.py on a GPU machine)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here: the connector class is not loaded (run tests/engines/vllm_pd.py on a GPU machine)", allow_module_level=True)


def test_the_connector_is_a_vllm_kv_connector():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from xinf_kv.vllm_connector import XinfConnector

    assert issubclass(XinfConnector, KVConnectorBase_V1)
