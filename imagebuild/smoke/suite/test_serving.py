"""The API a client sees: health, model list, chat (plain, streamed, tools, images), load."""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from imagebuild.facts.signals import compile_readers, signals_in
from imagebuild.smoke.probes import (
    TOOL,
    degenerate,
    message_text,
    png,
    sse_events,
    stream_text,
    tool_probe,
)


def test_health(api, log):
    r = api("GET", "/health", timeout=10)
    assert r.status_code == 200, f"/health answered {r.status_code}: {r.text[:200]}\n{log()}"


def test_models_lists_exactly_the_served_names(api, expect, log):
    r = api("GET", "/v1/models", timeout=10)
    assert r.status_code == 200, f"/v1/models answered {r.status_code}\n{log()}"
    served = sorted(m["id"] for m in r.json()["data"])
    want = sorted(expect["served_names"])
    assert served == want, (f"/v1/models lists {served}, the cell serves {want}\n"
                            f"{log('served.model.name|served_model_name|non-default args')}")


def test_no_weights_skipped_at_load(log_lines, log, expect):
    # docs/domain.md: a misplaced tensor prefix makes vLLM skip-load silently; only its log
    # shows it, in the words of the image's vLLM version (facts/signals.py)
    why = expect["log_unreadable"].get("weights_skipped")
    if why is not None:
        pytest.skip(f"not applicable: {why}")
    compiled = compile_readers(r for r in expect["log_readers"]
                               if r["signal"] == "weights_skipped")
    skipped = [line for line in log_lines if any(signals_in(line, compiled))]
    assert not skipped, (f"{len(skipped)} weight(s) skipped at load:\n"
                         + "\n".join(s[:300] for s in skipped[:10]) + f"\n{log()}")


def test_chat_completion_answers(chat, expect, log):
    # thinking as the cell serves it: a reasoning model's answer may sit in the reasoning field
    r = chat("Name three colours.", thinking=expect["reasoning"], min_tokens=4)
    assert r.status_code == 200, f"chat answered {r.status_code}: {r.text[:300]}\n{log()}"
    choice = r.json()["choices"][0]
    text = message_text(choice["message"])
    assert text.strip(), (f"chat returned no text in content, reasoning_content or reasoning: "
                          f"{json.dumps(choice)[:400]}\n{log()}")


def test_streaming_ends_with_done(api, model, expect, log):
    body = {"model": model, "stream": True, "max_tokens": 16, "min_tokens": 4,
            "temperature": 0, "messages": [{"role": "user", "content": "Count to five."}],
            "chat_template_kwargs": {"enable_thinking": expect["reasoning"]}}
    with api("POST", "/v1/chat/completions", json=body, stream=True) as r:
        assert r.status_code == 200, f"stream answered {r.status_code}: {r.text[:300]}\n{log()}"
        events = sse_events(r.iter_lines(decode_unicode=True))
    assert events and events[-1] == "[DONE]", (
        f"the stream ended with {events[-1:]!r} instead of [DONE] after {len(events)} "
        f"events\n{log()}")
    assert stream_text(events).strip(), f"the stream carried no text\n{events[:5]}\n{log()}"


def test_forced_tool_call_is_parsed(chat, expect, log):
    if not expect["tools"]:
        pytest.skip("the profile serves no tool calls (no --enable-auto-tool-choice)")
    regex, not_covered = tool_probe(expect["tool_parser"])
    if regex is None:
        pytest.skip(not_covered)
    r = chat("What is the weather in Paris?", tools=[TOOL], tool_choice="auto",
             max_tokens=128, structured_outputs={"regex": regex})
    assert r.status_code == 200, f"tool chat answered {r.status_code}: {r.text[:300]}\n{log()}"
    choice = r.json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    assert calls, (f"the {expect['tool_parser']} parser returned no tool_calls for a forced "
                   f"call; message: {json.dumps(choice['message'])[:400]}\n"
                   f"{log('tool|parser')}")
    fn = calls[0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == {"city": "Paris"}, (
        f"tool call parsed wrongly: {fn}")
    assert choice["finish_reason"] == "tool_calls", f"finish_reason {choice['finish_reason']}"


def test_image_request(chat, expect, log):
    if not expect.get("multimodal"):
        pytest.skip("the model is served text-only (no --limit-mm-per-prompt)")
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    r = chat([{"type": "text", "text": "What colour is this image? One word."},
              {"type": "image_url", "image_url": {"url": url}}], max_tokens=32)
    assert r.status_code == 200, f"image chat answered {r.status_code}: {r.text[:300]}\n{log()}"
    text = message_text(r.json()["choices"][0]["message"])
    assert not degenerate(text), (f"image answer is {text!r}: the vision tower is probably not "
                                  f"loaded\n{log('visual|vision|params_dict')}")


def test_burst_has_no_errors(chat, concurrency, log, record_property):
    def one(i: int) -> str | None:
        try:
            r = chat(f"Request {i}: write one sentence about the sea.", max_tokens=32,
                     min_tokens=4)
        except Exception as exc:  # noqa: BLE001 - every failure counts as an error here
            return f"#{i}: {type(exc).__name__}: {exc}"
        if r.status_code != 200:
            return f"#{i}: HTTP {r.status_code}: {r.text[:200]}"
        if not message_text(r.json()["choices"][0]["message"]).strip():
            return f"#{i}: empty answer"
        return None

    n = 2 * concurrency  # two waves, so the scheduler also refills a full batch
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        errors = [e for e in pool.map(one, range(n)) if e]
    took = time.monotonic() - t0
    record_property("requests", n)
    record_property("seconds", round(took, 2))
    record_property("errors", len(errors))
    assert not errors, (f"{len(errors)}/{n} requests failed at concurrency {concurrency} "
                        f"({took:.1f}s):\n" + "\n".join(errors[:10]) + f"\n{log()}")
