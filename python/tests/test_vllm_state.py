"""The vLLM connector's scheduler-side rules, without vLLM: what is saved when, what is
loaded, what the answer carries, and that bad fields never raise."""

from __future__ import annotations

import pytest

from xinf_kv.params import parse_params
from xinf_kv.vllm_state import SchedulerState

EP = '{"process":1,"provider":1,"tcp":"127.0.0.1:9"}'


def prefill(room=5, lease_ms=1000):
    return {"xinf": {"room": room, "lease_ms": lease_ms}}


def decode(n, room=5):
    return {"xinf": {"fetch": {"room": room, "endpoint": {"process": 1, "provider": 1, "tcp": "127.0.0.1:9"}, "device": None, "prompt_len": n}}}


def test_a_prefill_is_saved_in_the_step_that_computes_its_last_token():
    s = SchedulerState(16)
    s.endpoint = EP
    s.allocated("p", prefill(), 100, [1, 2, 3, 4, 5, 6, 7], 0)
    meta = s.step([("p", [1, 2, 3, 4, 5, 6, 7], 0)], [], {"p": 100})
    assert [(x.request_id, x.room, x.block_ids, x.prompt_len, x.lease_ms) for x in meta.saves] == [
        ("p", 5, [1, 2, 3, 4, 5, 6, 7], 100, 1000)
    ]
    assert s.step([], [("p", None, False)], {"p": 1}).saves == []
    params = s.finished("p", ok=True)
    assert params == {"xinf": {"room": 5, "endpoint": EP, "device": None, "pages": 2, "prompt_len": 100}}


def test_a_chunked_prefill_is_saved_once_with_every_block():
    s = SchedulerState(16)
    s.endpoint = EP
    s.allocated("p", prefill(), 70, [9, 8], 0)
    assert s.step([("p", [9, 8], 0)], [], {"p": 32}).saves == []
    assert s.step([], [("p", [7, 6], False)], {"p": 32}).saves == []
    [save] = s.step([], [("p", [5], False)], {"p": 6}).saves
    assert save.block_ids == [9, 8, 7, 6, 5]
    # A resumed (preempted) request brings its whole new block list.
    s.allocated("q", prefill(6), 20, [1], 0)
    s.step([("q", [1], 0)], [], {"q": 4})
    [save] = s.step([], [("q", [3, 4], True)], {"q": 16}).saves
    assert save.block_ids == [3, 4]


def test_an_aborted_or_unsaved_prefill_answers_nothing():
    s = SchedulerState(16)
    s.endpoint = EP
    s.allocated("a", prefill(), 10, [1], 0)
    s.step([("a", [1], 0)], [], {"a": 10})
    assert s.finished("a", ok=False) is None
    s.allocated("b", prefill(), 10, [1], 0)
    assert s.finished("b", ok=True) is None  # never scheduled: no KV
    s.endpoint = None
    s.allocated("c", prefill(), 10, [1], 0)
    s.step([("c", [1], 0)], [], {"c": 10})
    assert s.finished("c", ok=True) is None  # no page server known


def test_a_decode_loads_all_but_the_last_prompt_token_once():
    s = SchedulerState(16)
    assert s.matched("d", decode(130), 130, 0) == 129
    assert s.matched("d", decode(130), 130, 32) == 97  # a local prefix hit of two blocks
    s.allocated("d", decode(130), 130, list(range(1, 10)), 97)
    [load] = s.step([], [], {}).loads
    assert (load.room, load.start, load.end, load.block_ids) == (5, 32, 129, list(range(1, 10)))
    assert s.step([], [], {}).loads == []
    assert s.matched("d", decode(130), 130, 0) == 0  # asked once: a preempted request recomputes
    s.finished("d", ok=True)


def test_a_decode_that_continues_after_the_shown_first_token_loads_the_whole_room():
    # The prompt is the room's 130 tokens and the prefill's first token: vLLM computes that one.
    s = SchedulerState(16)
    assert s.matched("d", decode(130), 131, 0) == 130
    s.allocated("d", decode(130), 131, list(range(1, 10)), 130)
    [load] = s.step([], [], {}).loads
    assert (load.start, load.end) == (0, 130)
    # A one-token prompt then loads its one token.
    assert s.matched("one", decode(1), 2, 0) == 1


def test_a_load_is_synchronous_only_while_no_other_request_is_live():
    s = SchedulerState(16)
    assert s.matched("a", decode(130), 130, 0) == 129 and s.loads_synchronously("a")
    # Asked again (its blocks did not fit), and meanwhile another request came: asynchronous,
    # and the load vLLM is told about is the one the worker gets.
    assert s.matched("x", None, 10, 0) == 0 and not s.loads_synchronously("x")
    assert s.matched("a", decode(130), 130, 0) == 129 and not s.loads_synchronously("a")
    s.allocated("a", decode(130), 130, list(range(1, 10)), 129)
    [load] = s.step([], [], {}).loads
    assert not load.sync
    s.finished("x", ok=True)
    assert s.matched("b", decode(70), 70, 0) == 69 and not s.loads_synchronously("b")  # "a" runs
    s.finished("a", ok=True)
    s.finished("b", ok=False)
    assert s.matched("c", decode(70), 70, 0) == 69 and s.loads_synchronously("c")
    s.allocated("c", decode(70), 70, [4, 5, 6, 7, 8], 69)
    [load] = s.step([], [], {}).loads
    assert load.sync and (load.start, load.end) == (0, 69)
    s.finished("c", ok=True)
    assert not s.loads_synchronously("c")
    # Nothing to load is never a synchronous load.
    assert s.matched("d", decode(64), 66, 0) == 0 and not s.loads_synchronously("d")


def test_synchronous_loads_follow_the_limits_of_other_live_requests_and_tokens():
    never = SchedulerState(16, sync_max_live=-1)
    assert never.matched("a", decode(130), 130, 0) == 129 and not never.loads_synchronously("a")
    short = SchedulerState(16, sync_max_tokens=128)
    assert short.matched("a", decode(130), 130, 0) == 129 and not short.loads_synchronously("a")
    assert short.matched("a", decode(130), 130, 32) == 97 and short.loads_synchronously("a")
    two = SchedulerState(16, sync_max_live=2)
    for i, sync in enumerate([True, True, True, False]):
        assert two.matched(f"r{i}", decode(130), 130, 0) == 129
        assert two.loads_synchronously(f"r{i}") == sync


def test_a_decode_whose_room_holds_another_prompt_computes_it():
    s = SchedulerState(16)
    assert s.matched("d", decode(64), 66, 0) == 0
    assert s.matched("d", decode(64), 63, 0) == 0
    assert s.matched("one", decode(1), 1, 0) == 0  # nothing to load: vLLM computes the token


def test_requests_without_xinf_fields_are_left_alone():
    s = SchedulerState(16)
    for params in (None, {}, {"do_remote_decode": True}):
        assert s.matched("x", params, 10, 0) == 0
        s.allocated("x", params, 10, [1], 0)
        assert s.step([("x", [1], 0)], [], {"x": 10}).saves == []
        assert s.finished("x", ok=True) is None


@pytest.mark.parametrize(
    "params, why",
    [
        ({"xinf": 3}, "xinf must be an object"),
        ({"xinf": {"room": "7"}}, "room must be an integer"),
        ({"xinf": {"room": True}}, "room must be an integer"),
        ({"xinf": {"room": 0}}, "room must be an integer"),
        ({"xinf": {"room": 1 << 63}}, "room must be an integer"),
        ({"xinf": {"room": 4, "lease_ms": -1}}, "lease_ms must be an integer"),
        ({"xinf": {"fetch": []}}, "fetch must be an object"),
        ({"xinf": {"fetch": {"room": 2, "prompt_len": 3}}}, "endpoint must be an object"),
        ({"xinf": {"fetch": {"room": 2, "endpoint": "{}", "prompt_len": 0}}}, "prompt_len must be a positive"),
        ({"xinf": {"fetch": {"room": 2, "endpoint": "{}", "device": 5, "prompt_len": 3}}}, "device must be"),
    ],
)
def test_bad_fields_are_named_and_never_raise(params, why):
    handoff, reason = parse_params(params)
    assert handoff is None and why in reason
    s = SchedulerState(16)
    assert s.matched("r", params, 10, 0) == 0
    s.allocated("r", params, 10, [1], 3)
    assert s.step([("r", [1], 0)], [], {"r": 10}).saves == [] and s.finished("r", ok=True) is None
