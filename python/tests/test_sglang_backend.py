"""xinf's SGLang transfer backend, driven the way SGLang 0.5.15's scheduler drives it (the
calls of ``sglang/srt/disaggregation/prefill.py`` and ``decode.py``, in their order), over
token pools and metadata buffers laid out as SGLang lays them out and real page servers on
loopback. SGLang itself is not needed: the plugin that registers the backend is tried on the
GPU machine, where SGLang runs."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import sglang_pool, vllm_cache
from xinf_kv import params, sglang_backend as sb, vllm_layout

L, H, D = 3, 2, 64
SHAPE = {"layers": L, "kv_heads": H, "head_dim": D, "elem_bytes": 2}


def metadata_buffers(rows: int, hidden: int = 32):
    """SGLang's ``MetadataBuffers`` (CPU tensors), as numpy arrays in ``get_buf_infos`` order."""
    return [
        np.zeros((rows, 16), np.int32),
        np.zeros((rows, 16), np.int32),
        np.zeros((rows, 16), np.float32),
        np.zeros((rows, 16), np.int32),
        np.zeros((rows, 128), np.float32),
        np.zeros((rows, 128), np.int32),
        np.zeros((rows, 16), np.float32),
        np.zeros((rows, 16), np.int64),
        np.zeros((rows, hidden), np.float16),
        np.zeros((rows, 8), np.uint64),
    ]


def kv_args(pools, aux, page_size=1):
    """SGLang's ``KVArgs`` as ``_init_kv_manager`` fills it: every layer's K, then every V."""
    ks, vs = [k for k, _ in pools], [v for _, v in pools]
    return SimpleNamespace(
        engine_rank=0,
        kv_data_ptrs=[vllm_layout.address(x) for x in ks + vs],
        kv_data_lens=[x.nbytes for x in ks + vs],
        kv_item_lens=[x[0].nbytes * page_size for x in ks + vs],
        aux_data_ptrs=[vllm_layout.address(a) for a in aux],
        aux_data_lens=[a.nbytes for a in aux],
        aux_item_lens=[a[0].nbytes for a in aux],
        state_types=[],
        page_size=page_size,
        gpu_id=None,  # host memory here; SGLang passes its GPU
    )


@pytest.fixture
def endpoint_file(tmp_path, monkeypatch):
    path = tmp_path / "kv-endpoint.json"
    monkeypatch.setenv("XINF_KV_ENDPOINT_FILE", str(path))
    return path


def prefill_server(rng, slots_total, endpoint_file):
    pools = [sglang_pool(slots_total, H, D, rng) for _ in range(L)]
    aux = metadata_buffers(4)
    mgr = sb.XinfKVManager(kv_args(pools, aux), SimpleNamespace(value="prefill"))
    return pools, mgr


def decode_server(rng, slots_total):
    pools = [sglang_pool(slots_total, H, D, rng) for _ in range(L)]
    aux = metadata_buffers(4)
    mgr = sb.XinfKVManager(kv_args(pools, aux), "decode")
    return pools, aux, mgr


def decode_ticket(endpoint_file, n, first_token, first_logprobs=None):
    announced = json.loads(endpoint_file.read_text())
    fetch = {"endpoint": announced["endpoint"], "device": announced["device"], "prompt_len": n, "first_token": first_token}
    if first_logprobs is not None:
        fetch["first_logprobs"] = first_logprobs
    return params.make_ticket({"fetch": fetch, "shape": SHAPE})


def wait_for(receiver, until=10.0):
    deadline = time.monotonic() + until
    while receiver.poll() == sb.TRANSFERRING and time.monotonic() < deadline:
        time.sleep(0.01)
    return receiver.poll()


def prefill(mgr, room, slots, chunk=64):
    """The prefill server's calls for one request: bootstrap, init, a send per chunk (page ids of
    the chunk's tokens; SGLang's page size 1 makes them the slots), the last one marked."""
    sender = sb.XinfKVSender(mgr, f"{params.make_ticket({'lease_ms': 10_000, 'shape': SHAPE})}:8998", room, [0], 0)
    assert sender.poll() == sb.WAITING_FOR_INPUT
    sender.init(len(slots), 0)
    for start in range(0, len(slots), chunk):
        part = np.array(slots[start : start + chunk], np.int32)
        last = start + chunk >= len(slots)
        if sender.should_send_kv_chunk(len(part), last):
            sender.send(part, None)
        if not last:
            assert sender.poll() == sb.WAITING_FOR_INPUT
    return sender


@pytest.mark.parametrize("length", [1, 63, 64, 65, 129, 193])
def test_sglang_to_sglang_bit_for_bit_with_the_first_token_and_room(native, rng, endpoint_file, length):
    p_pools, p_mgr = prefill_server(rng, length + 30, endpoint_file)
    p_slots = list(rng.permutation(np.arange(1, length + 30))[:length])
    room = int(rng.integers(1, 1 << 62))
    sender = prefill(p_mgr, room, p_slots)
    assert sender.poll() == sb.SUCCESS
    assert sender.get_transfer_metric().transfer_total_bytes == -(-length // 64) * native.Layout("token-pool", 1, L, H, D, 8, 2).page_bytes

    d_pools, aux, d_mgr = decode_server(rng, length + 200)
    before = [(k.copy(), v.copy()) for k, v in d_pools]
    d_slots = list(rng.permutation(np.arange(1, length + 200))[:length])
    ticket = decode_ticket(endpoint_file, length, first_token=4242)
    receiver = sb.XinfKVReceiver(d_mgr, f"{ticket}:0", room)
    assert receiver.poll() == sb.BOOTSTRAPPING
    receiver.init(0)
    assert receiver.poll() == sb.WAITING_FOR_INPUT
    aux[9][2, 0] = 0
    receiver.send_metadata(np.array(d_slots, np.int64), 2, None, 0)
    assert wait_for(receiver) == sb.SUCCESS and receiver.conclude_state == sb.SUCCESS
    assert aux[0][2, 0] == 4242 and not aux[0][2, 1:].any()
    assert aux[9][2, 0] == room and not aux[1][2].any()
    untouched = np.setdiff1d(np.arange(length + 200), d_slots)
    for l in range(L):
        for kv in range(2):
            got, src, old = d_pools[l][kv], p_pools[l][kv], before[l][kv]
            assert got[d_slots].tobytes() == src[p_slots].tobytes()
            assert got[untouched].tobytes() == old[untouched].tobytes()
    assert p_mgr.host.stats()["host_bytes_out"] == d_mgr.loader.stats()["host_bytes_in"] > 0
    assert p_mgr.host.release(room)


@pytest.mark.parametrize("with_logprobs", [True, False])
def test_the_first_tokens_logprobs_go_where_sglangs_decode_reads_them(native, rng, endpoint_file, with_logprobs):
    """SGLang's decode reports the first token's log-probabilities from the metadata row
    (``_commit_transfer_to_req``: ``output_token_logprobs_val[0]``, ``_idx[0]``, the first
    ``top_logprobs_num`` of the top rows): the prefill side's from the ticket, else zeros, never
    what an earlier request left there."""
    length = 65
    _, p_mgr = prefill_server(rng, length + 10, endpoint_file)
    room = int(rng.integers(1, 1 << 62))
    prefill(p_mgr, room, list(range(1, length + 1)))
    _, aux, d_mgr = decode_server(rng, length + 10)
    for i in (2, 3, 4, 5):
        aux[i][1] = 7  # an earlier request's values
    top = [[4242, -0.25], [17, -1.5], [3, -2.75]]
    lp = {"logprob": -0.25, "top": top} if with_logprobs else None
    receiver = sb.XinfKVReceiver(d_mgr, f"{decode_ticket(endpoint_file, length, 4242, lp)}:0", room)
    receiver.init(0)
    receiver.send_metadata(np.arange(1, length + 1), 1, None, 0)
    assert wait_for(receiver) == sb.SUCCESS
    if with_logprobs:
        assert aux[2][1, 0] == np.float32(-0.25) and aux[3][1, 0] == 4242
        assert aux[4][1, :3].tolist() == [-0.25, -1.5, -2.75] and aux[5][1, :3].tolist() == [4242, 17, 3]
        assert not aux[2][1, 1:].any() and not aux[4][1, 3:].any() and not aux[5][1, 3:].any()
    else:
        for i in (2, 3, 4, 5):
            assert not aux[i][1].any(), i
    assert aux[0][1, 0] == 4242 and aux[9][1, 0] == room
    assert p_mgr.host.release(room)


def test_vllm_prefill_to_sglang_decode_through_the_receiver(native, rng, endpoint_file):
    """A room published by vLLM's connector (paged-packed blocks of 16) lands in SGLang's pool."""
    n, B = 130, 16
    caches = [vllm_cache(-(-n // B) + 2, H, B, D, "NHD", rng) for _ in range(L)]
    table = list(range(1, 1 + -(-n // B)))
    host = native.PageHost()
    host.publish(77, native.Layout(**vllm_layout.describe(caches)), [vllm_layout.address(c) for c in caches], table, n, 10_000)
    d_pools, aux, d_mgr = decode_server(rng, n + 10)
    slots = list(range(5, 5 + n))
    fetch = {"endpoint": json.loads(host.endpoint), "device": None, "prompt_len": n, "first_token": 9}
    receiver = sb.XinfKVReceiver(d_mgr, f"{params.make_ticket({'fetch': fetch, 'shape': SHAPE})}:0", 77)
    receiver.init(0)
    receiver.send_metadata(slots, 0)
    assert wait_for(receiver) == sb.SUCCESS
    for l in range(L):
        for t in range(n):
            src = caches[l][table[t // B], :, t % B]
            assert d_pools[l][0][slots[t]].tobytes() == src[:, :D].tobytes()
            assert d_pools[l][1][slots[t]].tobytes() == src[:, D:].tobytes()
    assert aux[0][0, 0] == 9 and aux[9][0, 0] == 77


def test_sglang_prefill_to_vllm_decode_leaves_the_last_token(native, rng, endpoint_file):
    """vLLM's decode imports N-1 tokens of the room SGLang's sender published."""
    n, B = 129, 16
    p_pools, p_mgr = prefill_server(rng, n + 3, endpoint_file)
    p_slots = list(range(2, 2 + n))
    assert prefill(p_mgr, 31, p_slots, chunk=50).poll() == sb.SUCCESS
    caches = [vllm_cache(-(-n // B) + 1, H, B, D, "HND", rng) for _ in range(L)]
    before = [c.copy() for c in caches]
    table = list(range(1, 1 + -(-n // B)))
    loader = native.PageLoader()
    loader.start("v", p_mgr.host.endpoint, 31, None, native.Layout(**vllm_layout.describe(caches)), [vllm_layout.address(c) for c in caches], table, (0, n - 1))
    assert loader.wait(10.0) == [("v", None)]
    for l in range(L):
        for t in range(n):
            got = caches[l][table[t // B], :, t % B]
            if t < n - 1:
                assert got[:, :D].tobytes() == p_pools[l][0][p_slots[t]].tobytes()
                assert got[:, D:].tobytes() == p_pools[l][1][p_slots[t]].tobytes()
            else:
                assert got.tobytes() == before[l][table[t // B], :, t % B].tobytes()


def test_the_endpoint_file_names_this_page_server(native, rng, endpoint_file):
    _, mgr = prefill_server(rng, 10, endpoint_file)
    announced = json.loads(endpoint_file.read_text())
    assert announced == {"endpoint": json.loads(mgr.host.endpoint), "device": None}


def test_a_load_that_fails_is_reported_failed_with_its_reason(native, rng, endpoint_file):
    _, p_mgr = prefill_server(rng, 10, endpoint_file)  # a live page server without room 999
    _, aux, mgr = decode_server(rng, 100)
    receiver = sb.XinfKVReceiver(mgr, f"{decode_ticket(endpoint_file, 20, 1)}:0", 999)
    receiver.init(0)
    receiver.send_metadata(list(range(1, 21)), 1)
    assert wait_for(receiver) == sb.FAILED and receiver.conclude_state == sb.FAILED
    with pytest.raises(RuntimeError, match="room 999"):
        receiver.failure_exception()
    assert aux[9][1, 0] == 0  # SGLang's decode never sees the room


def test_an_abort_in_flight_waits_for_the_scatter_then_fails(native, rng, endpoint_file):
    _, p_mgr = prefill_server(rng, 300, endpoint_file)
    assert prefill(p_mgr, 5, list(range(1, 257))).poll() == sb.SUCCESS
    _, aux, mgr = decode_server(rng, 300)
    receiver = sb.XinfKVReceiver(mgr, f"{decode_ticket(endpoint_file, 256, 3)}:0", 5)
    receiver.init(0)
    receiver.send_metadata(list(range(1, 257)), 3)
    receiver.abort()
    states = []
    while (s := receiver.poll()) == sb.TRANSFERRING:
        states.append(s)
        time.sleep(0.005)
    assert s == sb.FAILED and aux[9][3, 0] == 0
    assert mgr.loader.stats()["loaded"] == 1  # the slots were written to the end before SGLang could free them


def test_an_abort_before_the_load_fails_at_once(native, rng, endpoint_file):
    prefill_server(rng, 10, endpoint_file)
    _, _, mgr = decode_server(rng, 10)
    receiver = sb.XinfKVReceiver(mgr, f"{decode_ticket(endpoint_file, 4, 3)}:0", 5)
    receiver.init(0)
    receiver.abort()
    assert receiver.poll() == sb.FAILED and receiver.conclude_state == sb.FAILED


def test_a_sender_aborted_after_publishing_releases_its_room(native, rng, endpoint_file):
    _, mgr = prefill_server(rng, 100, endpoint_file)
    sender = prefill(mgr, 8, list(range(1, 41)))
    assert len(mgr.host) == 1
    sender.abort()
    assert sender.poll() == sb.FAILED and len(mgr.host) == 0


def test_a_sender_aborted_before_its_last_chunk_publishes_nothing(native, rng, endpoint_file):
    _, mgr = prefill_server(rng, 200, endpoint_file)
    sender = sb.XinfKVSender(mgr, f"{params.make_ticket({'lease_ms': 1000, 'shape': SHAPE})}:1", 9)
    sender.init(100, 0)
    sender.should_send_kv_chunk(64, False)
    sender.send(list(range(1, 65)))
    sender.abort()
    sender.should_send_kv_chunk(36, True)
    sender.send(list(range(65, 101)))
    assert sender.poll() == sb.FAILED and len(mgr.host) == 0


@pytest.mark.parametrize(
    ("host", "room", "reason"),
    [
        ("10.0.0.1", 5, "not an xinf ticket"),
        ("xinf-zz", 5, "does not decode"),
        (params.make_ticket([1]), 5, "must hold an object"),
        (params.make_ticket({"lease_ms": 5}), 5, "shape"),
        (params.make_ticket({"lease_ms": 5, "shape": SHAPE}), 0, "bootstrap_room must be an integer"),
        (params.make_ticket({"lease_ms": -1, "shape": SHAPE}), 5, "the xinf ticket's lease_ms"),
        (params.make_ticket({"fetch": {"endpoint": {"tcp": "x"}, "prompt_len": 3}, "shape": SHAPE}), 5, "first_token"),
        (params.make_ticket({"fetch": {"endpoint": {}, "prompt_len": 0, "first_token": 1}, "shape": SHAPE}), 5, "fetch.prompt_len"),
        ("xinf-" + "00" * 10_000, 5, "at most"),
        (params.make_ticket({"fetch": {"endpoint": {}, "prompt_len": 3, "first_token": 1, "first_logprobs": {"top": []}}, "shape": SHAPE}), 5, "first_logprobs must hold a logprob"),
        (params.make_ticket({"fetch": {"endpoint": {}, "prompt_len": 3, "first_token": 1, "first_logprobs": {"logprob": -1, "top": [[1]]}}, "shape": SHAPE}), 5, "first_logprobs.top must hold"),
        (params.make_ticket({"fetch": {"endpoint": {}, "prompt_len": 3, "first_token": 1, "first_logprobs": {"logprob": -1, "top": [[-1, 0.5]]}}, "shape": SHAPE}), 5, "first_logprobs.top must hold"),
        (params.make_ticket({"fetch": {"endpoint": {}, "prompt_len": 3, "first_token": 1, "first_logprobs": {"logprob": True}}, "shape": SHAPE}), 5, "first_logprobs must hold a logprob"),
    ],
)
def test_bad_tickets_fail_the_request_with_the_reason_and_never_raise(native, rng, endpoint_file, host, room, reason):
    _, mgr = prefill_server(rng, 10, endpoint_file)
    _, _, dmgr = decode_server(rng, 10)
    parsed, why = params.parse_ticket(host, room)
    assert parsed is None and reason in why
    sender = sb.XinfKVSender(mgr, f"{host}:1", room)
    sender.init(3, 0)
    sender.should_send_kv_chunk(3, True)
    sender.send([1, 2, 3])
    receiver = sb.XinfKVReceiver(dmgr, f"{host}:1", room)
    receiver.init(0)
    receiver.send_metadata([1, 2, 3], 0)
    for side in (sender, receiver):
        assert side.poll() == sb.FAILED
        with pytest.raises(RuntimeError):
            side.failure_exception()


def test_a_ticket_for_the_other_side_fails(native, rng, endpoint_file):
    _, mgr = prefill_server(rng, 10, endpoint_file)
    sender = sb.XinfKVSender(mgr, f"{decode_ticket(endpoint_file, 3, 1)}:1", 4)
    assert sender.poll() == sb.FAILED


def test_slots_that_do_not_cover_the_prompt_fail_the_request(native, rng, endpoint_file):
    prefill_server(rng, 10, endpoint_file)
    _, _, mgr = decode_server(rng, 50)
    receiver = sb.XinfKVReceiver(mgr, f"{decode_ticket(endpoint_file, 20, 1)}:0", 5)
    receiver.init(0)
    receiver.send_metadata(list(range(1, 11)), 0)
    assert receiver.poll() == sb.FAILED
    with pytest.raises(RuntimeError, match="10 slots for a room of a 20-token prompt"):
        receiver.failure_exception()
    other = sb.XinfKVReceiver(mgr, f"{decode_ticket(endpoint_file, 5, 1)}:0", 5)
    other.init(0)
    other.send_metadata(list(range(1, 6)), 99)
    with pytest.raises(RuntimeError, match="metadata row 99"):
        other.failure_exception()


def test_a_room_of_another_shape_is_refused(native, rng, endpoint_file):
    _, mgr = prefill_server(rng, 10, endpoint_file)
    bad = dict(SHAPE, kv_heads=4)
    sender = sb.XinfKVSender(mgr, f"{params.make_ticket({'lease_ms': 1000, 'shape': bad})}:1", 4)
    sender.init(2, 0)
    sender.should_send_kv_chunk(2, True)
    sender.send([1, 2])
    with pytest.raises(RuntimeError, match="4 KV heads of 64 × 2 bytes for slots of 256 bytes"):
        sender.failure_exception()


def test_what_cannot_be_moved_is_refused_at_start(native, rng):
    pools = [sglang_pool(10, H, D, rng) for _ in range(L)]
    aux = metadata_buffers(2)
    with pytest.raises(ValueError, match="--page-size 1"):
        sb.XinfKVManager(kv_args(pools, aux, page_size=16), "decode")
    with pytest.raises(ValueError, match="MLA"):
        sb.XinfKVManager(kv_args(pools, aux), "decode", None, True)
    args = kv_args(pools, aux)
    args.state_types = ["mamba"]
    with pytest.raises(ValueError, match="other state"):
        sb.XinfKVManager(args, "decode")
    args = kv_args(pools, aux)
    args.kv_data_ptrs = args.kv_data_ptrs[:-1]
    with pytest.raises(ValueError, match="5 KV buffers"):
        sb.XinfKVManager(args, "decode")
    args = kv_args(pools, aux[:9])
    with pytest.raises(ValueError, match="9 metadata buffers"):
        sb.XinfKVManager(args, "decode")


def test_every_prefill_address_is_known_with_one_rank(native, rng):
    _, _, mgr = decode_server(rng, 10)
    info = mgr.prefill_info_table.get("xinf-00:0")
    assert info.dp_size == 1 and mgr.try_ensure_parallel_info("anything")
