from specsample.bench.tasks import load_task


def test_humaneval_has_164_problems():
    prompts = load_task("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "HumanEval/0" and "def has_close_elements" in prompts[0].chat_text
    assert prompts[0].plain_text == prompts[0].problem["prompt"]


def test_prose_prompts_are_long_and_deterministic():
    first, second = load_task("prose", 4), load_task("prose", 4)
    assert [p.id for p in first] == [p.id for p in second]
    assert len(first) == 4 and all(len(p.chat_text) > 800 for p in first)
    assert all(p.chat_text.startswith("Summarise") for p in first)


def test_copy_task_includes_the_canonical_solution():
    for p in load_task("copy", 3):
        assert p.problem["canonical_solution"].strip() in p.chat_text
        assert p.problem["prompt"].strip() in p.chat_text
        assert "descriptive variable names" in p.chat_text


def test_n_limits_the_count():
    assert len(load_task("copy", 5)) == 5
