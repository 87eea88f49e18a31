"""A short streamed chat completion through the server on the real default pair
(llama.cpp backend), equal to the library's own greedy answer."""

import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from serve_helpers import running

pytestmark = pytest.mark.real


def test_streamed_chat_on_the_default_pair_equals_the_library(real_pair):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from openai import OpenAI

    from specsample.app.assemble import Models
    from specsample.serve.app import create_app
    from specsample.serve.settings import Settings

    target, draft = real_pair.load("llamacpp")
    greedy = SamplingConfig(temperature=0)
    models = Models(target, draft)
    app = create_app(target, models.drafter, models.drafter_name, Settings(model_name=target.name, policy=3))
    question = "Write a Python function that returns the square of a number."
    with running(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        chunks = list(client.chat.completions.create(
            model=target.name, messages=[{"role": "user", "content": question}], max_tokens=16, temperature=0,
            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = generate(target, target.tokenizer.chat_prompt(question),
                        GenerationConfig(max_new_tokens=16, sampling=greedy), ModelDrafter(draft, greedy), 3)
    assert text == expected.text and text.strip()
    speculative = chunks[-1].usage.model_dump()["speculative"]
    assert speculative["drafted"] > 0 and speculative["acceptance_rate"] is not None
