"""xinf's Web UI in headless Chromium (Selenium): the running models, a P/D launch through the
form (a refused option shown at the replica's field first, then a refused launch key at the
launch keys' field; the launch keys reach the model), a streamed chat answer, the
handoff counters moving, a replica added and removed, terminate; then the page in a Japanese
browser. Prints `ok <step>`
per step; screenshots into OUT_DIR.

Usage: ui_e2e.py URL OUT_DIR PRELOADED_UID
"""

import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

URL, OUT, PRELOADED = sys.argv[1:4]


def browser(lang="en-US"):
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    # The languages the browser asks pages in (its `Accept-Language`).
    opts.add_experimental_option("prefs", {"intl.accept_languages": lang})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def wait(d, what, cond, seconds=120):
    # The models page redraws every 2 s: an element found just before a redraw is stale when
    # read, which is a reason to look again, not a failure.
    try:
        return WebDriverWait(d, seconds, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: cond()
        )
    except Exception:
        d.save_screenshot(f"{OUT}/failed.png")
        raise AssertionError(f"timed out waiting for {what}; page text:\n{d.find_element(By.TAG_NAME, 'body').text}")


def tab(d, name):
    d.find_element(By.CSS_SELECTOR, f'nav button[data-tab="{name}"]').click()


def row(d, uid):
    rows = d.find_elements(By.CSS_SELECTOR, f'#model-table tbody tr[data-uid="{uid}"]')
    return rows[0] if rows else None


def refused_at(d, field, key, what):
    """Launches, and waits for the refusal naming `key` to be marked at `field`."""
    d.find_element(By.ID, "launch-button").click()
    wait(d, f"the refusal at {what}",
         lambda: "invalid" in field.get_attribute("class") and d.find_elements(By.CSS_SELECTOR, ".field-error"))
    error = d.find_element(By.ID, "launch-error").text
    assert key in error, error


def main():
    d = browser()
    try:
        d.get(URL + "/")
        wait(d, "the preloaded model", lambda: row(d, PRELOADED))
        assert "ready" in row(d, PRELOADED).text, row(d, PRELOADED).text
        d.save_screenshot(f"{OUT}/models.png")
        print("ok models listed")

        tab(d, "launch")
        wait(d, "the registry in the form", lambda: d.find_elements(By.CSS_SELECTOR, "#f-model_name option"))
        Select(d.find_element(By.ID, "f-model_name")).select_by_value("smollm2-instruct")
        wait(d, "the engines", lambda: d.find_elements(By.CSS_SELECTOR, "#f-model_engine option"))
        uid = d.find_element(By.ID, "f-model_uid")
        uid.send_keys("webpd")
        replicas = d.find_element(By.ID, "f-replica")
        replicas.clear()
        replicas.send_keys("2")
        wait(d, "two replica rows", lambda: len(d.find_elements(By.CSS_SELECTOR, "#replica-table tbody tr")) == 2)
        rows = d.find_elements(By.CSS_SELECTOR, "#replica-table tbody tr")
        Select(rows[0].find_element(By.NAME, "role")).select_by_value("prefill")
        Select(rows[1].find_element(By.NAME, "role")).select_by_value("decode")
        config = rows[1].find_element(By.NAME, "engine_config")
        config.send_keys('{"kv_cache_tokens": "lots"}')
        refused_at(d, config, "kv_cache_tokens", "the decode replica's engine config")
        d.save_screenshot(f"{OUT}/launch-refused.png")
        print("ok refusal shown by field")

        config.clear()
        # A launch key of the "more launch keys" object, refused by name, is marked there.
        keys = d.find_element(By.ID, "f-launch_keys")
        keys.send_keys('{"max_local_prefill_tokens": -1}')
        refused_at(d, keys, "max_local_prefill_tokens", "the launch keys")
        print("ok launch key refusal shown")

        keys.clear()
        keys.send_keys('{"request_limits": 8, "prefill_fallback": true}')
        d.find_element(By.ID, "launch-button").click()
        wait(d, "the launch", lambda: "Launched webpd" in d.find_element(By.ID, "launch-status").text, 300)
        limit = json.load(urllib.request.urlopen(URL + "/v1/models/webpd/stats"))["request_limit"]
        assert limit["limit"] == 8, limit
        d.save_screenshot(f"{OUT}/launch.png")
        print("ok prefill/decode launch")

        tab(d, "chat")
        wait(d, "webpd in the chat", lambda: d.find_elements(By.CSS_SELECTOR, '#chat-model option[value="webpd"]'))
        Select(d.find_element(By.ID, "chat-model")).select_by_value("webpd")
        temperature = d.find_element(By.ID, "chat-temperature")
        temperature.clear()
        temperature.send_keys("0")  # greedy: the answer is the model's own
        max_tokens = d.find_element(By.ID, "chat-max-tokens")
        max_tokens.clear()
        max_tokens.send_keys("48")
        d.find_element(By.ID, "chat-input").send_keys("What is the capital of France?")
        d.find_element(By.ID, "chat-send").click()
        answer = lambda: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done]")
        wait(d, "the streamed answer", answer, 300)
        text = answer()[0].text
        assert "Paris" in text, text
        d.save_screenshot(f"{OUT}/chat.png")
        print("ok chat answered")

        tab(d, "models")

        def pages():
            r = row(d, "webpd")
            h = r.find_elements(By.CSS_SELECTOR, ".handoff") if r else []
            return int(h[0].get_attribute("data-pages")) if h else 0

        wait(d, "the handoff counters", lambda: pages() > 0, 30)
        roles = [e.text for e in row(d, "webpd").find_elements(By.CSS_SELECTOR, ".role")]
        assert roles == ["prefill", "decode"], roles
        d.save_screenshot(f"{OUT}/models-pd.png")
        print(f"ok handoff counters moved ({pages()} pages)")

        # Another decode replica like the first, then that one removed: the model scales both ways.
        def replicas():
            r = row(d, "webpd")
            return [e.get_attribute("data-replica") for e in r.find_elements(By.CSS_SELECTOR, "tr[data-replica]")] if r else []

        before = replicas()
        decode = row(d, "webpd").find_elements(By.CSS_SELECTOR, "tr[data-replica]")[1]
        decode.find_element(By.CSS_SELECTOR, "button.add-replica").click()
        wait(d, "the added decode replica", lambda: len(replicas()) == 3, 120)
        added = [r for r in replicas() if r not in before][0]
        wait(d, "the added replica serving", lambda: "alive" in row(d, "webpd").find_element(By.CSS_SELECTOR, f'tr[data-replica="{added}"]').text, 120)
        print(f"ok replica added ({added})")
        row(d, "webpd").find_element(By.CSS_SELECTOR, f'tr[data-replica="{added}"] button.remove-replica').click()
        wait(d, "the removed replica gone", lambda: replicas() == before, 60)
        print("ok replica removed")

        row(d, "webpd").find_element(By.CSS_SELECTOR, "button.terminate").click()
        wait(d, "the terminated model to go", lambda: row(d, "webpd") is None, 60)
        print("ok terminate")
    finally:
        d.quit()
    japanese()


def japanese():
    """The page in a browser that asks for Japanese: its own texts, the rows it builds and the
    placeholders in Japanese, the model's data as it is."""
    d = browser("ja,en-US")
    try:
        d.get(URL + "/")
        nav = lambda: [b.text for b in d.find_elements(By.CSS_SELECTOR, "nav button")]  # noqa: E731
        wait(d, "the texts in Japanese", lambda: nav() == ["モデル", "起動", "チャット"])
        assert d.find_element(By.TAG_NAME, "html").get_attribute("lang") == "ja"
        wait(d, "the preloaded model", lambda: row(d, PRELOADED))
        wait(d, "its replica table in Japanese", lambda: "レプリカ" in row(d, PRELOADED).text)
        assert row(d, PRELOADED).find_element(By.CSS_SELECTOR, "button.terminate").text == "終了"
        tab(d, "launch")
        role = d.find_element(By.CSS_SELECTOR, '#replica-table select[name="role"] option[value=""]')
        assert role.text == "（通常）", role.text
        gpus = d.find_element(By.CSS_SELECTOR, '#replica-table input[name="gpu_idx"]')
        assert gpus.get_attribute("placeholder") == "例：0 または 0,1", gpus.get_attribute("placeholder")
        d.save_screenshot(f"{OUT}/launch-ja.png")
        print("ok the page in Japanese")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
