"""Drives kvslim's web page in headless Chromium (Selenium, the system's
chromium and chromedriver) against running `kvslim serve` instances:

* chat: a message sent, the reply seen streaming in (the reply's DOM
  changes several times before it is done) and its stats line (tokens/s,
  KV bytes against the full cache); a bad free spec shows the grammar's error;
* KV inspector: two policies run, each drawn token strip checked against
  `POST /v1/kv/inspect` for the same text (one layer and head, another layer
  and head, the aggregate over heads, and a step of the eviction replay);
* contexts: a long text refused with the server's message shown; a short
  text read from a file (FileReader), compressed under the plain H2O preset
  with the elapsed seconds shown meanwhile, listed with its tokens and kept
  vs full K/V bytes (as `GET /v1/contexts/{id}`), a question on it streamed
  with its timing line (first token against the document's prefill), then
  deleted and gone from the list and the server;
* status: the cards filled from /metrics;
* a 400 px wide window (chat and contexts), and a server with `--api-key` (the page asks for
  the key, then chats).

Screenshots go to --out. Usage (scripts/browser_check.sh starts the servers):

    python3 scripts/browser_check.py --url http://127.0.0.1:P --key-url http://127.0.0.1:Q --key KEY --out DIR
"""

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

TEXT = (
    "The old lighthouse keeper, Tomas, climbed the ninety-nine stairs every evening. He lit the great lamp, "
    "wrote the wind and the weather in his blue book, and watched the fishing boats come home. One night in "
    "November a storm came from the north. The lamp flickered, and Tomas saw a small boat without lights near "
    "the rocks. He rang the bell three times, and the boat turned away from the rocks just in time."
)


def post(url, path, body, key=None):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=120 * SCALE) as r:
        return json.load(r)


def get(url, path, key=None):
    """(status, JSON body) of a GET; an HTTP error's status and body too."""
    req = urllib.request.Request(url + path)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=60 * SCALE) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def browser(width, height):
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.add_argument(f"--window-size={width},{height}")
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(options=opts, service=service)
    d.set_window_size(width, height)
    return d


SCALE = 1.0  # --timeout-scale: larger models take longer


def wait(d, what, cond, timeout=90):
    try:
        return WebDriverWait(d, timeout * SCALE, poll_frequency=0.05).until(lambda _: cond())
    except Exception as e:
        log = d.get_log("browser") if hasattr(d, "get_log") else []
        raise AssertionError(f"timed out waiting for {what}; browser log: {log}") from e


def set_input(d, id_, value):
    e = d.find_element(By.ID, id_)
    e.clear()
    e.send_keys(str(value))


def shot(d, out, name):
    path = os.path.join(out, name)
    d.save_screenshot(path)
    print(f"  screenshot {path} ({os.path.getsize(path) // 1024} KiB)")


def chat(d, message, max_tokens=48):
    """Sends one message; returns (reply text, stats line, DOM updates seen)."""
    before = len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    set_input(d, "temperature", 0)
    set_input(d, "max-tokens", max_tokens)
    # counts changes to the reply's body as it streams in
    d.execute_script(
        """
        window.__updates = 0;
        const seen = new WeakSet();
        new MutationObserver(() => {
          const m = [...document.querySelectorAll('.msg.assistant')].pop();
          if (m && !m.dataset.done) window.__updates++;
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
        """
    )
    box = d.find_element(By.ID, "chat-input")
    box.send_keys(message)
    box.send_keys(Keys.ENTER)
    wait(d, "a reply", lambda: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) > before)
    m = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    wait(d, "the reply to finish", lambda: m.get_attribute("data-done"), timeout=150)
    assert m.get_attribute("data-done") == "1", m.text
    body = m.find_element(By.CSS_SELECTOR, ".body").text
    stats = m.find_element(By.CSS_SELECTOR, ".stats").text
    return body, stats, d.execute_script("return window.__updates")


def strip(d, panel):
    """(pos → (class, data-kept)) of a panel's drawn token strip."""
    spans = d.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .strip .tok')]"
        ".map(s => [Number(s.dataset.pos), s.className, Number(s.dataset.kept)])",
        "#" + panel,
    )
    return {p: (cls, k) for p, cls, k in spans}


def select(d, id_, value):
    Select(d.find_element(By.ID, id_)).select_by_value(str(value))


def check_panel(d, panel, answer, layer, head, step=None):
    """The strip drawn for (layer, head) equals the endpoint's kept set (or,
    at an earlier step, the trace's replay); 'all' heads: counts per token."""
    want_sel = [str(layer), str(head), str(answer["fed"] - 1 if step is None else step)]
    got_sel = d.execute_script(
        "const s = document.querySelector(arguments[0] + ' .strip'); return [s.dataset.layer, s.dataset.head, s.dataset.step]",
        "#" + panel,
    )
    assert got_sel == want_sel, f"{panel}: the strip drawn is for {got_sel}, not {want_sel}"
    drawn = strip(d, panel)
    n = len(answer["token_ids"])
    assert sorted(drawn) == list(range(n)), f"{panel}: one span per token"
    last = answer["fed"] - 1
    step = last if step is None else step
    heads = range(answer["n_kv_heads"]) if head == "all" else [head]

    def kept_at(h):
        if step >= last:
            return set(answer["kept"]["layers"][layer]["kv_heads"][h])
        gone = {e[3] for e in answer["trace"] if e[1] == layer and e[2] == h and e[0] <= step}
        start = 0
        kept = set()
        if answer.get("prefill_kept"):
            start = answer["prefill"]
            kept = set(answer["prefill_kept"]["layers"][layer]["kv_heads"][h])
        return {p for p in kept | set(range(start, step + 1)) if p not in gone}

    sets = [kept_at(h) for h in heads]
    for p in range(n):
        cls, k = drawn[p]
        want = sum(p in s for s in sets)
        if p > step:
            assert "future" in cls, f"{panel} pos {p} after step {step}: {cls}"
            continue
        assert k == want, f"{panel} layer {layer} head {head} step {step} pos {p}: drawn {k}, want {want}"
        if want == len(sets):
            assert "kept" in cls, (p, cls)
        elif want == 0:
            assert "evicted" in cls, (p, cls)
    return sum(1 for p in range(n) if drawn[p][1] == len(sets) and p <= step)


def contexts(d, args):
    """The Contexts view: an API error shown, a file compressed, listed,
    asked, deleted."""
    d.find_element(By.ID, "tab-contexts").click()
    wait(d, "the context list", lambda: d.find_element(By.ID, "ctx-list").get_attribute("data-count") is not None)
    before = {c["id"] for c in get(args.url, "/v1/contexts")[1]["data"]}
    select(d, "ctx-policy-select", "h2o:heavy=6.25%,recent=6.25%")
    wait(d, "the policy check", lambda: d.find_element(By.CSS_SELECTOR, "#ctx-policy .canon").text)

    # more tokens than the model's context: the server's 400, shown
    ctx_len = get(args.url, "/v1/models")[1]["data"][0]["context_length"]
    d.execute_script(
        "const t = document.getElementById('ctx-text'); t.value = arguments[0]; t.dispatchEvent(new Event('input'))",
        (TEXT + " ") * (ctx_len // 40 + 1),
    )
    d.find_element(By.ID, "ctx-compress").click()
    wait(d, "the refusal", lambda: d.find_element(By.ID, "ctx-error").text, 60)
    err = d.find_element(By.ID, "ctx-error").text
    print(f"contexts: a long text refused: {err}")
    assert "tokens" in err and str(ctx_len) in err, err

    # a short text from a file
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(TEXT)
    try:
        d.find_element(By.ID, "ctx-file").send_keys(f.name)
        wait(d, "the file's text", lambda: d.find_element(By.ID, "ctx-text").get_attribute("value") == TEXT, 10)
    finally:
        os.unlink(f.name)
    info = d.find_element(By.ID, "ctx-file-info").text
    assert info.endswith(f"{len(TEXT)} characters"), info
    d.execute_script(
        """
        window.__progress = [];
        new MutationObserver(() => window.__progress.push(document.getElementById('ctx-progress').textContent))
          .observe(document.getElementById('ctx-progress'), {childList: true, subtree: true, characterData: true});
        """
    )
    d.find_element(By.ID, "ctx-compress").click()
    wait(d, "the compression", lambda: d.find_element(By.ID, "ctx-progress").get_attribute("data-done"), 150)
    assert d.find_element(By.ID, "ctx-progress").get_attribute("data-done") == "1", d.find_element(By.ID, "ctx-error").text
    seen = d.execute_script("return window.__progress")
    assert any(re.search(r"^prefilling .* · \d+ s$", t) for t in seen), seen
    cid = d.execute_script("return ctxv.selected")
    assert cid and cid not in before, cid
    status, c = get(args.url, "/v1/contexts/" + cid)
    assert status == 200 and c["tokens"] > 0 and 0 < c["kv_bytes"] < c["kv_bytes_full"], (status, c)
    item = f'.ctx-item[data-id="{cid}"]'
    wait(d, "the context in the list", lambda: d.find_elements(By.CSS_SELECTOR, item))
    facts = d.find_element(By.CSS_SELECTOR, item + " .facts").text
    share = f"({100 * c['kv_bytes'] / c['kv_bytes_full']:.1f}%)"
    assert facts.startswith(f"{c['tokens']} tokens · ") and share in facts and "compressed in" in facts, (facts, c)
    assert "selected" in d.find_element(By.CSS_SELECTOR, item).get_attribute("class")
    print(f"contexts: {cid} compressed ({d.find_element(By.ID, 'ctx-progress').text}); listed: {facts}")

    # a question, streamed, with the timing line
    set_input(d, "ctx-max-tokens", 48)
    box = d.find_element(By.ID, "ctx-input")
    box.send_keys("Who rang the bell, and how many times?")
    box.send_keys(Keys.ENTER)
    wait(d, "an answer", lambda: d.find_elements(By.CSS_SELECTOR, "#ctx-messages .msg.assistant"))
    m = d.find_element(By.CSS_SELECTOR, "#ctx-messages .msg.assistant")
    wait(d, "the answer to finish", lambda: m.get_attribute("data-done"), 150)
    assert m.get_attribute("data-done") == "1", m.text
    body = m.find_element(By.CSS_SELECTOR, ".body").text
    stats = m.find_element(By.CSS_SELECTOR, ".stats").text
    print(f"contexts: answer {body!r}; {stats}")
    assert body.strip(), "an empty answer"
    assert re.search(r"^first token [\d.]+ s \(the document's prefill took [\d.]+ s once\) · total [\d.]+ s", stats), stats
    assert f"on {c['tokens']} of the context" in stats and "KV held" in stats, stats
    turns = d.execute_script("return ctxv.messages.map(m => m.role)")
    assert turns == ["user", "assistant"], turns
    shot(d, args.out, "web-contexts.png")

    # deleted: gone from the list and the server
    d.find_element(By.CSS_SELECTOR, item + " button.danger").click()
    wait(d, "the context to go", lambda: not d.find_elements(By.CSS_SELECTOR, item), 30)
    assert not d.find_element(By.ID, "ctx-list-error").text, d.find_element(By.ID, "ctx-list-error").text
    assert not d.find_element(By.ID, "ctx-chat").is_displayed()
    status, _ = get(args.url, "/v1/contexts/" + cid)
    assert status == 404, status
    print(f"contexts: {cid} deleted (GET /v1/contexts/{cid}: {status})")


def run(args):
    os.makedirs(args.out, exist_ok=True)
    d = browser(1200, 860)
    try:
        t0 = time.time()
        d.get(args.url + "/")
        wait(d, "the model name", lambda: d.find_element(By.ID, "model").text)
        print(f"page loaded: {d.find_element(By.ID, 'model').text}")

        # chat
        body, stats, updates = chat(d, args.prompt)
        print(f"chat: {len(body)} chars in {updates} DOM updates; {stats}")
        assert body.strip(), "an empty reply"
        assert updates >= 2, f"the reply did not stream in ({updates} update)"
        assert "tok/s" in stats and "KV held" in stats and "full cache" in stats, stats
        shot(d, args.out, "web-chat.png")

        # a bad free spec: the grammar's message under the field
        Select(d.find_element(By.ID, "chat-policy-select")).select_by_value("custom")
        set_input(d, "chat-policy-spec", "h2o:heavy=oops")
        wait(d, "the spec error", lambda: d.find_element(By.ID, "chat-policy-error").text)
        err = d.find_element(By.ID, "chat-policy-error").text
        print(f"bad spec: {err}")
        assert "heavy" in err, err
        Select(d.find_element(By.ID, "chat-policy-select")).select_by_value("h2o:heavy=32,recent=32")
        wait(d, "the error to clear", lambda: not d.find_element(By.ID, "chat-policy-error").text)

        # inspector: two policies, strips against the endpoint
        d.find_element(By.ID, "tab-inspect").click()
        set_input(d, "inspect-text", TEXT)
        pa, pb = "h2o:heavy=12,recent=12", "sink:sink=4,recent=20"
        for side, spec in (("a", pa), ("b", pb)):
            Select(d.find_element(By.ID, f"inspect-policy-{side}-select")).select_by_value("custom")
            set_input(d, f"inspect-policy-{side}-spec", spec)
        wait(d, "the specs to check", lambda: "slots" in d.find_element(By.ID, "inspect-policy-b").text)
        d.find_element(By.ID, "inspect-run").click()
        wait(d, "the inspection", lambda: d.find_element(By.ID, "inspect-view").get_attribute("data-ready") == "1", 150)
        err = d.find_element(By.ID, "inspect-error").text
        assert not err, err
        answers = {}
        for panel, spec in (("panel-a", pa), ("panel-b", pb)):
            answers[panel] = post(args.url, "/v1/kv/inspect", {"prompt": TEXT, "kv_policy": spec, "trace": True})
            kept = check_panel(d, panel, answers[panel], 0, 0)
            print(f"{panel} ({spec}): layer 0 head 0 strip = endpoint ({kept} kept of {answers[panel]['fed']} fed)")
        a = answers["panel-a"]
        layer, head = a["n_layers"] - 1, a["n_kv_heads"] - 1
        select(d, "inspect-layer", layer)
        select(d, "inspect-head", head)
        for panel in answers:
            check_panel(d, panel, answers[panel], layer, head)
        print(f"layer {layer} head {head}: both strips = endpoint")
        select(d, "inspect-head", "all")
        for panel in answers:
            check_panel(d, panel, answers[panel], layer, "all")
        print(f"layer {layer}, all KV heads: per-token counts = endpoint")
        select(d, "inspect-head", 0)
        mid = (a["fed"] - 1) // 2
        d.execute_script(
            "const s = document.getElementById('inspect-step'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('input'));",
            mid,
        )
        for panel in answers:
            check_panel(d, panel, answers[panel], layer, 0, step=mid)
        print(f"step {mid}: strips = the trace's replay")
        # a prefill chunk: the replay starts from what the chunk kept
        prefill = 24
        set_input(d, "inspect-prefill", prefill)
        d.execute_script("document.getElementById('inspect-view').dataset.ready = ''")
        d.find_element(By.ID, "inspect-run").click()
        wait(d, "the inspection", lambda: d.find_element(By.ID, "inspect-view").get_attribute("data-ready") == "1", 150)
        select(d, "inspect-layer", 0)
        mid = prefill + (a["fed"] - prefill) // 2
        d.execute_script(
            "const s = document.getElementById('inspect-step'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('input'));",
            mid,
        )
        for panel, spec in (("panel-a", pa), ("panel-b", pb)):
            ans = post(args.url, "/v1/kv/inspect", {"prompt": TEXT, "kv_policy": spec, "trace": True, "prefill": prefill})
            check_panel(d, panel, ans, 0, 0, step=mid)
        print(f"prefill {prefill}, step {mid}: strips = the replay from the prefill's kept sets")

        # the conversation so far, sent as chat messages
        set_input(d, "inspect-prefill", 0)

        def rerun():
            d.execute_script("document.getElementById('inspect-view').dataset.ready = ''")
            d.find_element(By.ID, "inspect-run").click()
            wait(d, "the inspection", lambda: d.find_element(By.ID, "inspect-view").get_attribute("data-ready") == "1", 150)

        d.find_element(By.ID, "inspect-from-chat").click()
        messages = d.execute_script("return insp.messages")
        assert [m["role"] for m in messages] == ["user", "assistant"], messages
        rerun()
        ans = post(args.url, "/v1/kv/inspect", {"messages": messages, "kv_policy": pa, "trace": True})
        kept = check_panel(d, "panel-a", ans, 0, 0)
        print(f"the conversation ({len(ans['token_ids'])} tokens through the chat template): strip = endpoint ({kept} kept)")
        d.find_element(By.ID, "inspect-from-chat").click()
        assert d.find_element(By.ID, "inspect-text").get_attribute("value") == TEXT
        rerun()
        d.execute_script(
            "const s = document.getElementById('inspect-step'); s.value = s.max; s.dispatchEvent(new Event('input'));"
        )
        shot(d, args.out, "web-inspect.png")

        contexts(d, args)

        # status, live: a request runs in the background meanwhile
        load = {"prompt": "Once upon a time", "max_tokens": 200, "n": 4, "temperature": 0.8, "kv_policy": "h2o:heavy=32,recent=32"}
        worker = threading.Thread(target=post, args=(args.url, "/v1/completions", load), daemon=True)
        worker.start()
        d.find_element(By.ID, "tab-status").click()
        running = lambda: d.execute_script(
            "const c = [...document.querySelectorAll('#status-cards .card')].find(c => c.firstChild.textContent === 'running');"
            "return c ? Number(c.querySelector('.v').textContent) : -1"
        )
        wait(d, "the running request to show", lambda: running() >= 1, 30)
        wait(d, "a few refreshes", lambda: len(d.find_elements(By.CSS_SELECTOR, "#tps-chart div")) >= 4, 10)
        text = d.find_element(By.ID, "status-cards").text
        assert "KV pool in use" in text and "running" in text, text
        shot(d, args.out, "web-status.png")
        print(f"status: {running()} sequences running seen live")

        # phone width
        d.set_window_size(400, 860)
        d.find_element(By.ID, "tab-chat").click()
        time.sleep(0.3)
        width = d.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400, f"the page is {width} px wide in a 400 px window"
        shot(d, args.out, "web-chat-400.png")
        d.find_element(By.ID, "tab-contexts").click()
        time.sleep(0.3)
        width = d.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400, f"the contexts view is {width} px wide in a 400 px window"
        print(f"main server checks took {time.time() - t0:.1f} s")
    finally:
        d.quit()

    # a server with --api-key: the page asks for it, then works
    d = browser(1200, 860)
    try:
        d.get(args.key_url + "/")
        wait(d, "the key form", lambda: d.find_element(By.ID, "keybox").is_displayed())
        shot(d, args.out, "web-api-key.png")
        set_input(d, "key-input", "wrong-key")
        d.find_element(By.ID, "key-save").click()
        wait(d, "the refusal", lambda: "Incorrect API key" in d.find_element(By.ID, "key-error").text)
        set_input(d, "key-input", args.key)
        d.find_element(By.ID, "key-save").click()
        wait(d, "the model name", lambda: d.find_element(By.ID, "model").text)
        assert not d.find_element(By.ID, "keybox").is_displayed()
        body, stats, _ = chat(d, "Once upon a time", max_tokens=24)
        assert body.strip() and "tok/s" in stats, (body, stats)
        print(f"with --api-key: key asked for, wrong key refused, chat works ({stats})")
    finally:
        d.quit()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--key-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--prompt", default="Write a Python function that returns the square of a number.")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every wait (a 1.5B model on few cores: 4)")
    args = p.parse_args()
    global SCALE
    SCALE = args.timeout_scale
    run(args)
    print("browser_check: every check passed")


if __name__ == "__main__":
    sys.exit(main())
