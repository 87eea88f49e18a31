import pytest

from specsample.bench.tasks import HUMANEVAL_STOPS, TASKS, load_task, stdlib_docstrings

from benchmarks.peers import first_stop
from benchmarks.tasks import RESEARCH_TASKS  # noqa: F401 (registers the research bench's tasks: humaneval-chat ...)

pytestmark = pytest.mark.pure


def test_humaneval_is_the_raw_completion_protocol():
    prompts = load_task("humaneval")
    assert len(prompts) == 164 and prompts[0].id == "HumanEval/0"
    assert prompts[0].text == prompts[0].problem["prompt"]  # no instruction, no fence
    task = TASKS["humaneval"]
    assert not task.chat and task.max_new_tokens == 384 and task.stop_strings == HUMANEVAL_STOPS


def test_humaneval_chat_is_its_own_task():
    p = load_task("humaneval-chat", 1)[0]
    assert p.task == "humaneval-chat" and "def has_close_elements" in p.text and p.text.startswith("Complete")
    task = TASKS["humaneval-chat"]
    assert task.chat and task.max_new_tokens == 512 and task.stop_strings == ()


def test_summarize_prompts_are_long_and_deterministic():
    first, second = load_task("summarize", 4), load_task("summarize", 4)
    assert [p.id for p in first] == [p.id for p in second]
    assert len(first) == 4 and all(len(p.text) > 800 and p.text.startswith("Summarise") for p in first)
    assert TASKS["summarize"].chat and TASKS["summarize"].max_new_tokens == 128
    assert len(load_task("summarize")) >= 8  # enough for the default run


def test_copy_task_includes_the_canonical_solution():
    for p in load_task("copy", 3):
        assert p.problem["canonical_solution"].strip() in p.text
        assert p.problem["prompt"].strip() in p.text
        assert "descriptive variable names" in p.text


def test_explain_asks_for_long_answers_that_no_stop_string_cuts_short():
    p = load_task("explain", 1)[0]
    assert p.text.startswith("Explain") and p.problem["canonical_solution"].strip() in p.text
    task = TASKS["explain"]
    assert task.chat and task.max_new_tokens >= 128 and task.stop_strings == ()


def test_n_limits_the_count():
    assert len(load_task("copy", 5)) == 5
    with pytest.raises(ValueError):
        load_task("prose")


@pytest.mark.parametrize("text,expected", [
    ("    return x\n\ndef g():\n", 13),  # the newline just before the next function
    ("    return x\n\n\nif __name__ == '__main__':", 14),
    ("    return x\n# a comment", 12),
    ("    return x\nclass A:", 12),
    ("    return x\nprint(f(1))", 12),
    ("    if x:\n        return 1\n    return 2\n", None),  # indented `if` is inside the body
    ("    # a comment inside the body\n    return x", None),
    ("    return x\n\n# first\ndef g(): pass", 13),  # the earliest stop wins
    ("", None),
])
def test_humaneval_stop_sequences(text, expected):
    assert first_stop(text, HUMANEVAL_STOPS) == expected


def test_no_stop_strings_never_stop():
    assert first_stop("anything\ndef", ()) is None


def test_chat_asks_thirteen_kinds_in_turn_from_offline_text():
    from specsample.bench.chat_task import KINDS

    prompts = load_task("chat")
    assert len(prompts) == 26 and [p.kind for p in prompts[:13]] == list(KINDS) == [p.kind for p in prompts[13:]]
    assert prompts == load_task("chat")  # the same prompts every run
    assert len({p.text for p in prompts}) == 26
    assert TASKS["chat"].chat and TASKS["chat"].max_new_tokens == 128
    rag = [p for p in prompts if p.kind == "rag"]
    docs = dict(stdlib_docstrings())
    for p in rag:  # the asked-about document is among the six, not first or last
        module = p.id.removeprefix("rag-")
        assert p.text.count("\nDocument ") + p.text.startswith("Document ") >= 5 and docs[module] in p.text
        assert not p.text.split("\n\n", 2)[1].startswith(f"Document 1 ({module})")
    assert all(len(p.text) > 5000 for p in rag)  # long context: about 2,000 tokens
