"""The prefill side's room lifecycle and the decode side's load reports, over real page
servers on loopback."""

from __future__ import annotations

import socket
import time

import pytest

PAGE = 1024


def pages(n: int, fill: int = 1) -> bytes:
    return bytes([fill]) * (PAGE * n)


def host_and_loader(native):
    host = native.PageHost()
    layout = native.Layout("token-pool", 1, 1, 1, 256, 200, 2)  # a page of 1 layer · 2 · 64 · 256 · 2 bytes
    return host, layout


def test_release_then_fetch_reports_the_unknown_room(native):
    host = native.PageHost()
    host.publish_pages(11, PAGE, pages(2), 10_000)
    assert len(host) == 1
    assert host.release(11)
    assert len(host) == 0 and host.stats()["released"] == 1
    loader = native.PageLoader()
    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)  # 1024-byte pages
    buf = bytearray(layout.region_bytes * 2)
    import ctypes

    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    loader.start("gone", host.endpoint, 11, None, layout, [base, base + layout.region_bytes], list(range(1, 11)), (0, 10))
    [(rid, err)] = loader.wait(10.0)
    assert rid == "gone" and "room 11" in err
    assert loader.stats()["failed"] == 1


def test_a_lease_expires_unless_fetches_renew_it(native):
    host = native.PageHost()
    host.publish_pages(21, PAGE, pages(1), 400)
    host.publish_pages(22, PAGE, pages(1), 400)
    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)
    import ctypes

    buf = bytearray(layout.region_bytes * 2)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    loader = native.PageLoader()
    for _ in range(4):
        time.sleep(0.2)
        loader.start("renew", host.endpoint, 22, None, layout, [base, base + layout.region_bytes], [1], (0, 1))
        assert loader.wait(5.0) == [("renew", None)]
    deadline = time.monotonic() + 5
    while len(host) and time.monotonic() < deadline:
        time.sleep(0.05)
    s = host.stats()
    assert s["expired"] == 2 and s["rooms"] == 0 and s["staged_bytes"] == 0


def test_publishing_is_checked(native):
    host = native.PageHost(budget_bytes=PAGE * 3)
    with pytest.raises(ValueError, match="room 0"):
        host.publish_pages(0, PAGE, pages(1), 1000)
    host.publish_pages(1, PAGE, pages(2), 1000)
    with pytest.raises(ValueError, match="room 1 is published already"):
        host.publish_pages(1, PAGE, pages(1), 1000)
    with pytest.raises(RuntimeError, match="budget of 3072 bytes"):
        host.publish_pages(2, PAGE, pages(2), 1000)
    with pytest.raises(ValueError, match="pages of 512 bytes on a host serving pages of 1024"):
        host.publish_pages(3, 512, bytes(512), 1000)
    s = host.stats()
    assert s["refused"] == 1 and s["staged_bytes"] == 2 * PAGE
    assert host.release(1) and host.stats()["staged_bytes"] == 0
    with pytest.raises(ValueError, match="ip `nowhere`"):
        native.PageHost("nowhere")


def test_a_vanished_page_server_is_a_reported_failure_within_the_timeout(native):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = '{"process": 1, "provider": 1, "tcp": "127.0.0.1:%d"}' % port
    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)
    import ctypes

    buf = bytearray(layout.region_bytes * 2)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    loader = native.PageLoader()
    t0 = time.monotonic()
    loader.start("x", endpoint, 3, None, layout, [base, base + layout.region_bytes], [1], (0, 1), timeout_ms=2000)
    [(rid, err)] = loader.wait(10.0)
    assert rid == "x" and err and time.monotonic() - t0 < 5
    assert bytes(buf) == bytes(len(buf))
    with pytest.raises(ValueError, match="endpoint"):
        loader.start("y", "not json", 3, None, layout, [base, base + layout.region_bytes], [1], (0, 1))


def test_garbage_on_the_page_port_leaves_it_serving(native):
    host = native.PageHost()
    host.publish_pages(9, PAGE, pages(1, 7), 10_000)
    addr = host.endpoint.split('"tcp":"')[1].rstrip('"}')
    ip, port = addr.rsplit(":", 1)
    with socket.create_connection((ip, int(port))) as s:
        s.settimeout(5)
        # The server speaks first (its handshake); a peer without the page key is refused.
        hello = b""
        while len(hello) < 20:
            hello += s.recv(20 - len(hello))
        assert hello[:4] == b"XKA1"
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".ljust(48, b"x"))
        assert s.recv(1) == b"\x01"
    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)
    import ctypes

    buf = bytearray(layout.region_bytes * 2)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    loader = native.PageLoader()
    loader.start("after", host.endpoint, 9, None, layout, [base, base + layout.region_bytes], [5], (0, 1))
    assert loader.wait(5.0) == [("after", None)]
    assert buf[5 * 8 : 6 * 8] == b"\x07" * 8


def test_a_publish_that_fails_gives_its_budget_back(native):
    import ctypes

    host = native.PageHost(budget_bytes=1 << 20)
    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)
    buf = bytearray(layout.region_bytes)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    with pytest.raises(ValueError, match="overlap"):
        host.publish(4, layout, [base, base], [1, 2], 2, 1000)
    s = host.stats()
    assert s["staged_bytes"] == 0 and s["rooms"] == 0 and s["published"] == 0


SERVE = """
import sys, time
from xinf_kv import _native
host = _native.PageHost()
host.publish_pages(4, 1024, bytes([3]) * 1024, 60_000)
print(host.endpoint, flush=True)
sys.stdin.read()
"""


def test_only_processes_holding_the_page_key_fetch_from_each_other(native):
    """XINF_KV_KEY (what xinf gives its engine servers) keys a process's page plane: a server
    of another key refuses this process's fetch, one of the same key serves it."""
    import ctypes
    import subprocess
    import sys

    layout = native.Layout("token-pool", 1, 1, 1, 4, 200, 2)
    buf = bytearray(layout.region_bytes * 2)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    loader = native.PageLoader()
    # This test process set no key: it holds the all-zero one.
    for key, ok in (("ab" * 32, False), ("00" * 32, True)):
        env = dict(__import__("os").environ, XINF_KV_KEY=key)
        p = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        try:
            endpoint = p.stdout.readline().strip()
            loader.start(key, endpoint, 4, None, layout, [base, base + layout.region_bytes], [2], (0, 1))
            [(rid, err)] = loader.wait(10.0)
            assert rid == key
            if ok:
                assert err is None and buf[2 * 8 : 3 * 8] == b"\x03" * 8
            else:
                assert err is not None and "authentication" in err, err
        finally:
            p.stdin.close()
            p.wait(10)
