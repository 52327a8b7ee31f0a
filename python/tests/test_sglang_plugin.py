"""The plugin's poll hooks (``xinf_kv.sglang_plugin``): where every poller is xinf's and the
groups a poll reduces over are one process, SGLang's polls are taken without the all-reduces,
with the same values, failure injection and metadata gate; anything else goes to SGLang's own
function unchanged. The hooks are called here as SGLang's hook registry calls them (the
original first), with SGLang's private helpers stood in for, over a real one-process gloo group.
Registering them in SGLang is tried on the GPU machine, where SGLang runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from xinf_kv import sglang_backend as sb, sglang_plugin as plugin

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """A gloo group of one process, as a one-GPU SGLang server's CPU groups are."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def xinf_poller(cls, state):
    """A sender or receiver of xinf's in `state`, as far as a poll sees it."""
    p = cls.__new__(cls)
    p._state = state
    return p


class Foreign:
    """Another backend's poller (or SGLang's HiCache wrapper around xinf's)."""

    def poll(self):
        return sb.SUCCESS


def helpers(failed=()):
    """SGLang's `_poll_with_failure_injection` (failing the pollers at the indices `failed`) and
    `_apply_metadata_gate` (downgrading every Success), recording their calls."""
    calls = []

    def poll(pollers):
        calls.append("poll")
        return [sb.FAILED if i in failed else p.poll() for i, p in enumerate(pollers)]

    def gate(polls, decode_reqs, metadata_buffers, server_args):
        calls.append(("gate", decode_reqs, metadata_buffers, server_args))
        for i, v in enumerate(polls):
            if v == sb.SUCCESS:
                polls[i] = sb.TRANSFERRING

    return SimpleNamespace(_poll_with_failure_injection=poll, _apply_metadata_gate=gate), calls


def original_never_called(*args, **kwargs):
    raise AssertionError(f"SGLang's all-reducing poll was called: {args} {kwargs}")


def test_a_prefill_poll_of_xinfs_senders_alone_skips_both_reductions(one_process, caplog, monkeypatch):
    monkeypatch.setattr(plugin, "_SKIPPED", False)
    monkeypatch.setattr(plugin.log, "propagate", True)
    utils, calls = helpers(failed={1})
    pollers = [xinf_poller(sb.XinfKVSender, s) for s in (sb.SUCCESS, sb.SUCCESS, sb.WAITING_FOR_INPUT)]
    with caplog.at_level("INFO", logger="xinf_kv"):
        polls = plugin.poll_tp_cp(utils, original_never_called, pollers, one_process, one_process)
        plugin.poll_tp_cp(utils, original_never_called, pollers, one_process, one_process)
    assert polls == [sb.SUCCESS, sb.FAILED, sb.WAITING_FOR_INPUT] and calls == ["poll", "poll"]
    # Said once a process, so that a server's log shows the hook took effect.
    assert [r.getMessage() for r in caplog.records].count(
        "polls of xinf's transfers skip their all-reduces (every group is one process)"
    ) == 1


def test_a_decode_poll_keeps_the_metadata_gate(one_process):
    utils, calls = helpers()
    pollers = [xinf_poller(sb.XinfKVReceiver, s) for s in (sb.SUCCESS, sb.BOOTSTRAPPING)]
    polls = plugin.poll_one_group(
        utils, original_never_called, pollers, one_process, decode_reqs="q", metadata_buffers="m", server_args="a"
    )
    assert polls == [sb.TRANSFERRING, sb.BOOTSTRAPPING]
    assert calls == ["poll", ("gate", "q", "m", "a")]
    # Without the three (the queue's plain poll) there is no gate, as in SGLang.
    utils, calls = helpers()
    assert plugin.poll_one_group(utils, original_never_called, pollers, one_process) == [sb.SUCCESS, sb.BOOTSTRAPPING]
    assert calls == ["poll"]


@pytest.mark.parametrize("case", ["foreign poller", "no pollers", "no group"])
def test_anything_else_goes_to_sglangs_own_poll(one_process, case):
    utils, calls = helpers()
    pollers = [xinf_poller(sb.XinfKVSender, sb.SUCCESS)]
    group = one_process
    if case == "foreign poller":
        pollers.append(Foreign())
    elif case == "no pollers":
        pollers = []
    else:
        group = None
    seen = []

    def original(*args):
        seen.append(args)
        return ["sglang's"]

    assert plugin.poll_tp_cp(utils, original, pollers, group, one_process) == ["sglang's"]
    assert plugin.poll_one_group(utils, original, pollers, group, "q", "m", "a") == ["sglang's"]
    assert seen == [(pollers, group, one_process), (pollers, group, "q", "m", "a")] and calls == []
