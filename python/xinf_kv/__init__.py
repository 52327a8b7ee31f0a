"""xinf's KV connectors: vLLM and SGLang as prefill or decode replicas of xinf.

The engines run their own servers; xinf routes a request's prefill to one engine and its
decode to another (or to xinf's native engine), and the prompt's KV cache travels between
them as canonical 64-token pages over xinf's page plane. This package is the part that runs
inside the engine's processes:

- ``xinf_kv.vllm_connector.XinfConnector``: a vLLM KV connector (v1), selected with
  ``--kv-transfer-config '{"kv_connector": "XinfConnector",
  "kv_connector_module_path": "xinf_kv.vllm_connector", "kv_role": ...}'``.

- ``xinf_kv.sglang_backend``: an SGLang transfer backend, ``--disaggregation-mode prefill |
  decode --disaggregation-transfer-backend xinf``, added to SGLang by the plugin
  ``xinf_kv.sglang_plugin`` (entry point ``xinf`` of ``sglang.srt.plugins``).

Everything that touches bytes is in the extension module ``xinf_kv._native`` (built from
xinf's transfer crate): gathering a prompt's KV into staging, serving it as a room, fetching a
room GPU to GPU and scattering it into the engine's cache. Nothing here is imported by the
engines until they select the connector or the backend, and importing it does no CUDA work.
"""

from xinf_kv.params import DecodeParams, PrefillParams, parse_params

__all__ = ["DecodeParams", "PrefillParams", "parse_params"]
