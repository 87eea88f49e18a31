"""Chat prompts from a GGUF's own template, rendered as transformers renders them:
the template sees bos_token, eos_token and raise_exception, and a model whose
vocabulary wants a BOS gets exactly one. No llama.cpp needed: the tokenizer's
encoder is replaced by a word-per-token stub."""

import pytest

from specsample.backends.base import ChatTemplateError
from specsample.backends.llamacpp import LlamaCppTokenizer, render_chat, with_bos

pytestmark = pytest.mark.pure

# Mistral's template (as llama-cpp-python ships it): BOS written by the template, and
# alternation enforced with raise_exception.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
NO_BOS = "{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }} {% endfor %}<assistant>"
WORDS = ["<s>", "</s>", "[INST]", "[/INST]", "<user>", "<assistant>", "hi", "there"]


class StubTokenizer(LlamaCppTokenizer):
    """LlamaCppTokenizer's chat logic over a vocabulary of whitespace-separated words."""

    def __init__(self, template: str, add_bos: bool):
        self._template, self._bos, self._add_bos = template, 0, add_bos
        self._special_text = {"bos_token": "<s>", "eos_token": "</s>"}

    def encode(self, text: str, special: bool = False) -> list[int]:
        assert special  # the template's special tokens must parse as tokens
        return [WORDS.index(w) for w in text.replace("<s>", "<s> ").split()]


def test_the_template_sees_the_special_tokens_and_raise_exception():
    text = render_chat(MISTRAL, [{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>")
    assert text == "<s>[INST] hi [/INST]"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(MISTRAL, [{"role": "assistant", "content": "hi"}], bos_token="<s>")
    assert render_chat("{{ strftime_now('%Y') | length }}", []) == "4"


def test_a_template_cannot_reach_python_internals():
    with pytest.raises(Exception, match="unsafe|not safely callable|access to attribute"):
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])


@pytest.mark.parametrize("template,add_bos,expected", [
    (MISTRAL, True, [0, 2, 6, 3]),  # the template wrote the BOS: not a second one
    (NO_BOS, True, [0, 4, 6, 5]),  # the vocabulary wants one the template did not write
    (NO_BOS, False, [4, 6, 5]),  # Qwen: no BOS
])
def test_a_model_that_wants_a_bos_gets_exactly_one(template, add_bos, expected):
    assert StubTokenizer(template, add_bos).chat_messages([{"role": "user", "content": "hi"}]) == expected


def test_with_bos_needs_a_bos_token():
    assert with_bos([4, 5], -1, True) == [4, 5]
    assert with_bos([], 0, True) == [0]
