"""The host prompt cache (serve/prompt_cache.py): the longest shared start under the
request's own salt, least recently used out first within its bytes, an entry that
another extends dropped; and the worker's use of it on toy models: a side request does
not cost a conversation its prefix, and what is restored answers as a fresh prefill."""

import pytest
import torch

from specsample.backends.base import NoRoom, SavedSequence
from specsample.decoding.generate import GenerationConfig
from specsample.decoding.sampling import SamplingConfig
from specsample.serve.events import End, Ended, Finished
from specsample.serve.prompt_cache import PromptCache
from specsample.serve.worker import ChoiceTask, QueuedRequest, Worker

from toy import TrigramBackend, TrigramSequences, random_table

pytestmark = pytest.mark.pure


def saved(tokens, nbytes=None) -> SavedSequence:
    return SavedSequence(tuple(tokens), None, len(tokens) if nbytes is None else nbytes)


def test_the_longest_shared_start_is_found_under_the_requests_own_salt_only():
    cache = PromptCache(1000)
    cache.store(None, saved([1, 2, 3, 4]))
    cache.store(None, saved([1, 2, 9]))
    cache.store("alice", saved([1, 2, 3, 4, 5, 6]))
    entry, length = cache.longest(None, [1, 2, 3, 4, 5, 6, 7])
    assert entry.tokens == (1, 2, 3, 4) and length == 4
    entry, length = cache.longest(None, [1, 2, 9, 9])
    assert entry.tokens == (1, 2, 9) and length == 3
    assert cache.longest("alice", [1, 2, 3, 4, 5, 6, 7])[1] == 6
    assert cache.longest("mallory", [1, 2, 3, 4, 5, 6, 7]) is None  # another salt's entries are not there
    assert cache.longest(None, [7, 1, 2]) is None  # a shared chunk elsewhere is no start


def test_the_least_recently_used_entry_goes_first_and_a_use_counts_as_one():
    cache = PromptCache(10)
    for first in (1, 2, 3):
        assert cache.store(None, saved([first, 0, 0, 0]))  # 4 bytes each: two fit
    assert [e.tokens[0] for e in cache.entries(None)] == [2, 3] and cache.bytes == 8 and cache.evicted == 1
    cache.longest(None, [2, 0])  # 2 is used: 3 is now the oldest
    cache.store(None, saved([4, 0, 0, 0]))
    assert [e.tokens[0] for e in cache.entries(None)] == [2, 4]
    assert not cache.store(None, saved(list(range(11))))  # larger than the whole cache: not kept, nothing evicted
    assert len(cache) == 2


def test_an_entry_another_extends_goes_and_one_held_whole_is_not_stored_again():
    cache = PromptCache(100)
    cache.store(None, saved([1, 2, 3]))
    cache.store("alice", saved([1, 2, 3]))
    assert cache.store(None, saved([1, 2, 3, 4, 5]))  # a conversation's next turn replaces its last
    assert [e.tokens for e in cache.entries(None)] == [(1, 2, 3, 4, 5)] and cache.bytes == 5 + 3
    assert cache.holds(None, [1, 2, 3]) and not cache.holds(None, [1, 2, 4])
    assert not cache.store(None, saved([1, 2, 3, 4]))  # held whole already
    assert [e.tokens for e in cache.entries("alice")] == [(1, 2, 3)]  # another salt's is its own
    assert cache.drop(None) == 1 and cache.entries(None) == [] and cache.bytes == 3


def test_a_draft_models_copy_counts_in_the_entrys_bytes():
    cache = PromptCache(10)
    cache.store(None, saved([1, 2, 3], nbytes=4), saved([1, 2], nbytes=5))
    assert cache.bytes == 9
    assert not cache.store(None, saved([5, 6], nbytes=6), saved([5], nbytes=5))  # 11 > 10


# ---- the worker's use of it, on toy trigram models ----

SAMPLED = SamplingConfig(temperature=1.0)


class Inline:
    """Stands in for the request's event loop: events are queued at once."""

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


def run(worker: Worker, prompt, salt=None, cache_prompt=True, seed=1):
    """One request served in the test's thread, on the slot the worker picks for it;
    its GenerationResult."""
    config = GenerationConfig(max_new_tokens=5, sampling=SAMPLED, seed=seed, cache_prompt=cache_prompt)
    job = QueuedRequest([ChoiceTask(0, list(prompt), config)], lambda slot: None, Inline(), cache_salt=salt)
    worker._serve(job, worker._slot_for(job))
    events = []
    while not job.events.empty():
        events.append(job.events.get_nowait())
    assert isinstance(events[-1], Ended) and events[-1].end is End.DONE, events[-1]
    return next(e.result for e in events if isinstance(e, Finished))


def worker(prompt_cache_bytes=4000, parallel=1) -> Worker:
    target = TrigramSequences(random_table(12, 0), parallel) if parallel > 1 else TrigramBackend(random_table(12, 0))
    return Worker(target, 8, parallel=parallel, prompt_cache_bytes=prompt_cache_bytes)


CONVERSATION = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5]
SIDE = [1, 9, 9, 8]  # shares its first token only


def test_a_side_request_does_not_cost_the_conversation_its_prefix():
    w = worker()
    first = run(w, CONVERSATION)
    turn_2 = CONVERSATION + first.token_ids + [6, 7]
    run(w, SIDE)  # takes the one slot
    second = run(w, turn_2)
    held = len(CONVERSATION) + len(first.token_ids)
    assert second.stats.cached_prompt_tokens >= held - 1  # the slot held the first turn less its pending token
    assert w.prompt_cache.hits == 1 and w.prompt_cache.reused_tokens == second.stats.cached_prompt_tokens
    off = worker(prompt_cache_bytes=0)  # without it, the side request's slot shares one token
    run(off, CONVERSATION)
    run(off, SIDE)
    assert off.prompt_cache is None and run(off, turn_2).stats.cached_prompt_tokens == 1


def test_a_restored_prefix_answers_as_a_fresh_prefill():
    """Toy models have no numbers that move with the call: the answer is the same
    sample, token for token, as the same request on a fresh worker."""
    served, fresh = worker(), worker(prompt_cache_bytes=0)
    first = run(served, CONVERSATION)
    run(served, SIDE)
    turn_2 = CONVERSATION + first.token_ids + [6, 7]
    again = run(served, turn_2, seed=5)
    assert again.stats.cached_prompt_tokens > len(CONVERSATION)
    assert again.token_ids == run(fresh, turn_2, seed=5).token_ids


class Crowded(TrigramBackend):
    """A cache with no room to restore into, as llama.cpp's shared one can be: the
    sequence left empty, NoRoom raised."""

    def restore_sequence(self, seq, saved, length):
        self.tokens = []
        raise NoRoom("no run of free cells")


def test_a_restore_the_cache_has_no_room_for_scores_the_prompt_whole_and_answers():
    crowded = Worker(Crowded(random_table(12, 0)), 8, parallel=1, prompt_cache_bytes=4000)
    first = run(crowded, CONVERSATION)
    run(crowded, SIDE)
    turn_2 = CONVERSATION + first.token_ids + [6, 7]
    again = run(crowded, turn_2, seed=5)  # run() asserts the request ended DONE: no 500
    assert again.stats.cached_prompt_tokens == 0 and crowded.prompt_cache.no_room == 1
    assert crowded.prompt_cache.hits == 0 and crowded.prompt_cache.reused_tokens == 0
    assert again.token_ids == run(worker(prompt_cache_bytes=0), turn_2, seed=5).token_ids


def test_another_salts_entry_is_never_reused_nor_shown_in_cached_tokens():
    w = worker()
    run(w, CONVERSATION, salt="alice")
    run(w, SIDE, salt="alice")  # alice's conversation goes to host memory
    assert len(w.prompt_cache.entries("alice")) == 1
    assert run(w, CONVERSATION, salt="mallory").stats.cached_prompt_tokens == 0
    assert run(w, CONVERSATION).stats.cached_prompt_tokens == 0  # no salt is a salt of its own
    assert w.prompt_cache.hits == 0
    assert run(w, CONVERSATION, salt="alice").stats.cached_prompt_tokens == len(CONVERSATION) - 1


def test_a_slot_taken_by_another_salt_keeps_its_text_for_its_own_salt():
    w = worker(parallel=2)
    run(w, CONVERSATION, salt="alice")
    run(w, SIDE, salt="bob")
    run(w, [5, 5, 5], salt="carol")  # both slots were filled: one is emptied for carol
    assert run(w, CONVERSATION, salt="alice").stats.cached_prompt_tokens == len(CONVERSATION) - 1
    assert run(w, SIDE, salt="bob").stats.cached_prompt_tokens == len(SIDE) - 1


def test_an_erase_forgets_the_salts_texts_in_host_memory_too():
    w = worker()
    run(w, CONVERSATION)
    run(w, SIDE)
    erased = w.erase(0)
    w._erase()  # as the worker's thread does before its next request
    assert erased.result(timeout=0) > 0
    assert len(w.prompt_cache) == 0
    assert run(w, CONVERSATION).stats.cached_prompt_tokens == 0


def test_a_request_without_cache_prompt_keeps_the_slots_text_but_reuses_none():
    w = worker()
    run(w, CONVERSATION)
    assert run(w, CONVERSATION, cache_prompt=False).stats.cached_prompt_tokens == 0
    assert run(w, CONVERSATION + [4]).stats.cached_prompt_tokens == len(CONVERSATION)


def test_an_hf_cache_saved_and_restored_cut_to_a_shared_start_scores_the_rest_as_before():
    """transformers' DynamicCache: a deep copy restored into a sibling sequence and cut
    to the prompt's shared start; the rest scores as it does on the sequence that never
    left (the same kernels on the same cache tensors: equal, not close). The saved copy
    is untouched by the restore's later use, so it can be restored again."""
    from tiny_hf import tiny_backend

    prompt, rest = [5, 17, 3, 60, 42, 8, 11], [1, 2, 3]
    kept = tiny_backend(0)
    kept.score(prompt + [9, 9], 1)
    kept.rollback(len(prompt))
    expected = kept.score(rest, len(rest))
    source = tiny_backend(0)
    source.score(prompt + [9, 9], 1)
    saved = source.save_sequence()
    assert saved.tokens == tuple(prompt + [9, 9]) and saved.nbytes > 0
    other = source.sibling()
    other.score([7, 7, 7], 1)
    for _ in range(2):
        other.restore_sequence(0, saved, len(prompt))
        assert other.cached_tokens() == prompt and other.length == len(prompt)
        assert torch.equal(other.score(rest, len(rest)), expected)
