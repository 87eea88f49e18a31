"""cache_prompt over HTTP: a request scores only what its slot does not hold already of
its prompt, reports it as OpenAI's cached_tokens (and /infill as llama-server's
cache_n), goes to the slot that holds most of it, and answers as a fresh prefill would
(exact toy models); on unless the request or `serve --no-cache-prompt` says otherwise,
as in llama-server; `POST /slots/N?action=erase` empties a slot."""

import httpx
import pytest

from serve_helpers import WordTokenizer, running, toy_app

pytestmark = pytest.mark.system

CHAT = [{"role": "user", "content": "the cat sat on a mat"}]


def complete(url, prompt, **fields):
    r = httpx.post(url + "/v1/completions", timeout=30,
                   json={"model": "toy", "prompt": prompt, "max_tokens": 6, "seed": 1, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def cached(answer) -> int:
    return answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


def test_a_chats_next_turn_reuses_its_earlier_turns_and_answers_as_a_fresh_server_would():
    app, _ = toy_app(drafter="model")
    fresh_app, _ = toy_app(drafter="model")
    with running(app) as url, running(fresh_app) as fresh_url:
        def chat(base, messages, **fields):
            r = httpx.post(base + "/v1/chat/completions", timeout=30,
                           json={"model": "toy", "messages": messages, "max_tokens": 6, "seed": 2, **fields})
            assert r.status_code == 200, r.text
            return r.json()

        first = chat(url, CHAT, cache_prompt=True)
        turn_2 = CHAT + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "a dog ran far away"}]
        second = chat(url, turn_2, cache_prompt=True)
        held = len(WordTokenizer().chat_messages(CHAT))  # the first turn's prompt at least
        assert cached(second) >= held and cached(first) == 0
        assert second["usage"]["prompt_tokens"] == len(WordTokenizer().chat_messages(turn_2))
        assert second["choices"][0]["message"] == chat(fresh_url, turn_2)["choices"][0]["message"]


def test_cached_tokens_is_zero_not_absent_when_nothing_was_cached_whole_and_streamed():
    """The openai client read None for cached_tokens when the field was left out."""
    from openai import OpenAI

    app, _ = toy_app(drafter="none")
    with running(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        whole = client.completions.create(model="toy", prompt="the cat sat", max_tokens=3, extra_body={"cache_prompt": False})
        assert whole.usage.prompt_tokens_details.cached_tokens == 0
        chunks = list(client.chat.completions.create(model="toy", messages=CHAT, max_tokens=3, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"cache_prompt": False}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0


def test_on_unless_turned_off_and_the_servers_default_gives_way_to_the_requests_own():
    app, _ = toy_app(drafter="none")
    with running(app) as url:
        complete(url, "the cat sat on")
        assert cached(complete(url, "the cat sat on a mat")) > 0  # on by default, as llama-server's
        assert cached(complete(url, "the cat sat on a mat", cache_prompt=False)) == 0
    app, _ = toy_app(drafter="none", cache_prompt=False)  # serve --no-cache-prompt
    with running(app) as url:
        complete(url, "the cat sat on")
        assert cached(complete(url, "the cat sat on a mat")) == 0
        assert cached(complete(url, "the cat sat on a mat", cache_prompt=True)) > 0


def test_an_erased_slot_holds_nothing_for_the_next_request():
    app, _ = toy_app(drafter="model", parallel=2)
    with running(app) as url:
        complete(url, "the cat sat on")
        held = [httpx.post(f"{url}/slots/{seq}?action=erase", json={}, timeout=30) for seq in (0, 1)]
        assert [r.status_code for r in held] == [200, 200], [r.text for r in held]
        assert sorted(r.json()["n_erased"] for r in held)[0] == 0 and max(r.json()["n_erased"] for r in held) > 0
        assert cached(complete(url, "the cat sat on a mat")) == 0
        again = httpx.post(f"{url}/slots/0?action=erase", json={}, timeout=30).json()
        assert again["id_slot"] == 0


@pytest.mark.parametrize("path, param", [("/slots/2?action=erase", "id_slot"), ("/slots/0?action=save", "action"),
                                         ("/slots/0", "action")])
def test_a_slot_action_it_cannot_do_is_refused_with_the_field_that_is_wrong(path, param):
    app, _ = toy_app(drafter="none", parallel=2)
    with running(app) as url:
        r = httpx.post(url + path, json={}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_request_goes_to_the_slot_that_holds_most_of_its_prompt():
    app, _ = toy_app(drafter="none", parallel=2, cache_prompt=True)
    a, b = "the cat sat on a mat", "a dog ran far away and then"
    with running(app) as url:
        complete(url, a)
        complete(url, b)  # both slots hold a text now
        for prompt in (a, b):
            follow_up = complete(url, prompt + " it was here")
            assert cached(follow_up) >= len(WordTokenizer().encode(prompt)), prompt


def test_bad_cache_prompt_is_a_400_naming_it():
    app, _ = toy_app(drafter="none")
    with running(app) as url:
        r = httpx.post(url + "/v1/completions", timeout=30,
                       json={"model": "toy", "prompt": "the cat", "cache_prompt": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_prompt"


def test_erasing_a_slot_needs_the_api_key():
    app, _ = toy_app(drafter="none", api_key="secret")
    with running(app) as url:
        assert httpx.post(url + "/slots/0?action=erase", json={}, timeout=30).status_code == 401
        ok = httpx.post(url + "/slots/0?action=erase", json={}, headers={"Authorization": "Bearer secret"}, timeout=30)
        assert ok.status_code == 200, ok.text


def test_a_slot_is_reused_only_under_the_salt_that_filled_it():
    """vLLM's cache_salt: without it a client learned, from cached_tokens, how many of a
    secret's tokens it had guessed. Two slots: a salted request never reuses another
    salt's cache, nor an unsalted one a salted one's, on any route."""
    app, _ = toy_app(drafter="none", parallel=2)
    secret = "the cat sat on a mat and then it ran far away"
    with running(app) as url:
        complete(url, secret, cache_salt="alice")
        assert cached(complete(url, secret, cache_salt="alice")) > 0  # her own
        assert cached(complete(url, secret, cache_salt="mallory")) == 0
        assert cached(complete(url, secret)) == 0
        assert cached(complete(url, secret)) > 0  # unsalted requests share among themselves
        r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
            "model": "toy", "messages": CHAT, "max_tokens": 2, "cache_salt": "bob"})
        assert r.status_code == 200 and cached(r.json()) == 0
        r = httpx.post(url + "/v1/completions", timeout=30, json={"model": "toy", "prompt": "a", "cache_salt": ""})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_an_erase_sees_and_empties_only_a_cache_filled_under_its_own_salt():
    """Any key holder's erase reported n_erased for a slot filled under another salt (the
    length of its prompt and answer) and emptied it."""
    app, _ = toy_app(drafter="none")  # one slot
    secret = "the cat sat on a mat and then it ran far away"

    def erase(body):
        r = httpx.post(url + "/slots/0?action=erase", timeout=30, content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        return r.json()["n_erased"]

    with running(app) as url:
        complete(url, secret, cache_salt="alice")
        assert erase(b"") == erase(b"{}") == erase(b'{"cache_salt": "mallory"}') == 0
        assert cached(complete(url, secret, cache_salt="alice")) > 0  # still hers
        assert erase(b'{"cache_salt": "alice"}') > 0
        assert cached(complete(url, secret, cache_salt="alice")) == 0
        complete(url, secret)
        assert erase(b"") > 0  # an empty body, as llama-server's clients send it: the unsalted cache
        r = httpx.post(url + "/slots/0?action=erase", json={"cache_salt": ""}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
