"""Fill-in-the-middle: the FIM tokens read from the model's own vocabulary (a GGUF's
through llama.cpp, a Hugging Face tokenizer's by their spelling), the PSM prompt with
llama-server's layout of extra files, user text kept as text, the request paths of
/v1/completions (suffix) and /infill building the same ids, and the lookup drafter
reading the suffix."""

from types import SimpleNamespace

import pytest

from specsample.backends.fim_tokens import FimFormat, fim_from_ids, fim_from_tokens
from specsample.backends.hf import HFBackend, HFTokenizer
from specsample.backends.llamacpp import vocab_fim
from specsample.decoding.drafters import NgramDrafter
from specsample.decoding.generate import GenerationConfig, stream
from specsample.decoding.sampling import SamplingConfig
from specsample.output.fim import ExtraFile, fim_prompt
from specsample.serve.errors import APIError
from specsample.serve.request_config import completion_prompts, infill_prompts
from specsample.serve.schemas import CompletionRequest, InfillRequest

from tiny_hf import QWEN_FIM, tiny_fim_tokenizer, tiny_model

pytestmark = pytest.mark.pure

# Each text piece becomes one "token" that is its text, so the layout reads as it is.
PIECES = lambda text: [text] if text else []  # noqa: E731
FULL = FimFormat("PRE", "SUF", "MID", pad="PAD", repo="REP", file_sep="SEP")
PSM_ONLY = FimFormat("PRE", "SUF", "MID")
FILES = [ExtraFile("a.py", "x = 1"), ExtraFile("b.py", "y = 2")]

LAYOUTS = [  # (format, prefix, suffix, extra, prompt, expected)
    (PSM_ONLY, "def f(", ")", [], "", ["PRE", "def f(", "SUF", ")", "MID"]),
    # Without extra files no repository header, even for a model that has the tokens.
    (FULL, "def f(", ")", [], "", ["PRE", "def f(", "SUF", ")", "MID"]),
    (FULL, "", "", [], "", ["PRE", "SUF", "MID"]),  # the cursor in an empty file
    # `prompt` is text typed after the prefix: llama-server puts it before the suffix token.
    (FULL, "def f(", ")", [], "a, b", ["PRE", "def f(", "a, b", "SUF", ")", "MID"]),
    # The repository-level pattern: name, each file after a separator, then the current file.
    (FULL, "def f(", ")", FILES, "", ["REP", "myproject\n", "SEP", "a.py\n", "x = 1", "SEP", "b.py\n", "y = 2",
                                      "SEP", "filename\n", "PRE", "def f(", "SUF", ")", "MID"]),
    (FimFormat("PRE", "SUF", "MID", file_sep="SEP"), "p", "s", FILES[:1], "",
     ["SEP", "a.py\n", "x = 1", "SEP", "filename\n", "PRE", "p", "SUF", "s", "MID"]),
    # No separator token: the files are joined by llama-server's plain-text marker.
    (PSM_ONLY, "p", "s", FILES, "", ["\n\n--- snippet ---\n\n", "x = 1", "\n\n--- snippet ---\n\n", "y = 2",
                                     "PRE", "p", "SUF", "s", "MID"]),
    # A model that wants a BOS gets it first.
    (FimFormat("PRE", "SUF", "MID", bos="BOS"), "p", "s", [], "", ["BOS", "PRE", "p", "SUF", "s", "MID"]),
]


@pytest.mark.parametrize("fim,prefix,suffix,extra,prompt,expected", LAYOUTS)
def test_the_prompt_layout(fim, prefix, suffix, extra, prompt, expected):
    assert fim_prompt(fim, PIECES, prefix, suffix, extra, prompt) == expected


@pytest.mark.parametrize("vocab,expected", [
    ({"<|fim_prefix|>": 5, "<|fim_suffix|>": 6, "<|fim_middle|>": 7, "<|fim_pad|>": 8, "<|repo_name|>": 9,
      "<|file_sep|>": 10, "hello": 11}, FimFormat(5, 6, 7, pad=8, repo=9, file_sep=10)),  # Qwen2.5-Coder
    ({"▁<PRE>": 1, "▁<SUF>": 2, "▁<MID>": 3, "▁<EOT>": 4}, FimFormat(1, 2, 3)),  # CodeLlama
    ({"<｜fim▁begin｜>": 1, "<｜fim▁hole｜>": 2, "<｜fim▁end｜>": 3}, FimFormat(1, 2, 3)),  # DeepSeek-Coder
    ({"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3, "<reponame>": 4}, FimFormat(1, 2, 3, repo=4)),
    ({"<|fim_prefix|>": 5, "<|fim_suffix|>": 6}, None),  # no middle token: no FIM
    ({"<|im_start|>": 1, "<|im_end|>": 2}, None),  # a chat model
])
def test_the_format_from_a_vocabulary(vocab, expected):
    assert fim_from_tokens(vocab) == expected


def test_llama_cpp_null_tokens_are_missing_ones():
    assert fim_from_ids({"prefix": 1, "suffix": 2, "middle": -1}) is None
    assert fim_from_ids({"prefix": 1, "suffix": 2, "middle": 3, "repo": -1}, bos=0) == FimFormat(1, 2, 3, bos=0)


def llama_stub(ids: dict, bos: int = 0, add_bos: bool = False):
    """llama-cpp-python's vocabulary calls over fixed ids (-1: LLAMA_TOKEN_NULL)."""
    calls = {f"llama_vocab_fim_{k}": (lambda v, i=i: i) for k, i in ids.items()}
    return SimpleNamespace(**calls, llama_vocab_bos=lambda v: bos, llama_vocab_get_add_bos=lambda v: add_bos)


def test_a_gguf_format_comes_from_llama_cpp_vocabulary_calls():
    qwen = llama_stub({"pre": 151659, "suf": 151661, "mid": 151660, "pad": 151662, "rep": 151663, "sep": 151664})
    assert vocab_fim(qwen, None) == FimFormat(151659, 151661, 151660, pad=151662, repo=151663, file_sep=151664)
    codellama = llama_stub({"pre": 32007, "suf": 32008, "mid": 32009, "pad": -1, "rep": -1, "sep": -1}, bos=1,
                           add_bos=True)
    assert vocab_fim(codellama, None) == FimFormat(32007, 32008, 32009, bos=1)
    chat = llama_stub({"pre": -1, "suf": -1, "mid": -1, "pad": -1, "rep": -1, "sep": -1})
    assert vocab_fim(chat, None) is None


@pytest.fixture(scope="module")
def fim_tokenizer():
    return HFTokenizer(tiny_fim_tokenizer())


@pytest.fixture(scope="module")
def fim_target(fim_tokenizer):
    return HFBackend(tiny_model(0, vocab=len(fim_tokenizer)), fim_tokenizer, name="tiny-fim")


def test_an_hf_model_takes_its_fim_ids_from_its_tokenizer(fim_tokenizer, fim_target):
    hf = fim_tokenizer.hf
    ids = [hf.convert_tokens_to_ids(t) for t in QWEN_FIM]
    assert fim_target.fim == FimFormat(prefix=ids[0], suffix=ids[2], middle=ids[1], pad=ids[3], repo=ids[4],
                                       file_sep=ids[5])
    # Its pad, repository and file-separator tokens end a generation, as on llama.cpp.
    assert fim_target.eos_token_ids == {hf.eos_token_id, *ids[3:]}
    plain = HFTokenizer(tiny_fim_tokenizer(fim_tokens=()))
    plain_target = HFBackend(tiny_model(0, vocab=len(plain)), plain)
    assert plain_target.fim is None and plain_target.eos_token_ids == {plain.hf.eos_token_id}


def test_user_text_that_spells_a_fim_token_stays_text(fim_tokenizer, fim_target):
    fim = fim_target.fim
    ids = fim_prompt(fim, fim_tokenizer.text_ids, "x = <|fim_middle|>", "<|fim_suffix|> y", [ExtraFile("<|file_sep|>", "")])
    assert ids.count(fim.middle) == 1 and ids[-1] == fim.middle
    assert ids.count(fim.suffix) == 1 and ids.count(fim.file_sep) == 2  # the file's and the current file's
    assert fim_tokenizer.decode(ids) == "myproject\n<|file_sep|>\nfilename\nx = <|fim_middle|><|fim_suffix|> y"


def test_suffix_and_infill_build_the_same_prompt(fim_tokenizer, fim_target):
    completion = CompletionRequest(model="m", prompt="def add(a, b):\n    return ", suffix="\n\nx = add(1, 2)\n")
    infill = InfillRequest(input_prefix="def add(a, b):\n    return ", input_suffix="\n\nx = add(1, 2)\n")
    (ids, text), = completion_prompts(completion, fim_target)
    assert infill_prompts(infill, fim_target) == [(ids, None)] and text is None
    assert ids == fim_prompt(fim_target.fim, fim_tokenizer.text_ids, completion.prompt, completion.suffix)
    plain, = completion_prompts(completion.model_copy(update={"suffix": ""}), fim_target)
    assert plain == (fim_tokenizer.encode(completion.prompt), completion.prompt)  # an empty suffix asks for no FIM


def test_a_model_without_fim_tokens_is_refused_naming_the_field(fim_target):
    plain = HFTokenizer(tiny_fim_tokenizer(fim_tokens=()))
    target = HFBackend(tiny_model(0, vocab=len(plain)), plain)
    with pytest.raises(APIError, match="no fill-in-the-middle tokens") as e:
        completion_prompts(CompletionRequest(model="m", prompt="x", suffix="y"), target)
    assert e.value.status == 400 and e.value.param == "suffix"
    with pytest.raises(APIError, match="no fill-in-the-middle tokens") as e:
        infill_prompts(InfillRequest(input_prefix="x"), target)
    assert e.value.status == 400 and e.value.param == "input_suffix"


def test_the_lookup_drafter_reads_the_suffix_and_the_extra_files():
    """The FIM prompt holds suffix and files as tokens, and stream() hands the drafter the
    whole prompt as its context: what follows the cursor can be proposed."""
    words = {w: i for i, w in enumerate("PRE SUF MID return a + b ; print x".split())}
    text_ids = lambda text: [words[w] for w in text.split()]  # noqa: E731
    fim = FimFormat(words["PRE"], words["SUF"], words["MID"])
    ids = fim_prompt(fim, text_ids, "return a", "return a + b ;")
    drafter = NgramDrafter(max_ngram=2)
    # After MID the context ends in "MID"; once the middle starts "return a" the lookup
    # finds the suffix's "return a" and proposes what follows it there.
    assert drafter.lookup(ids + text_ids("return a"), 3) == (text_ids("+ b ;"), 2)
    assert drafter.lookup(fim_prompt(fim, text_ids, "return a", "print x") + text_ids("return a"), 3)[0] != \
        text_ids("+ b ;")  # a negative control: without it in the suffix nothing proposes it

    seen = []
    offer = drafter.offer
    drafter.offer = lambda context, k, grammar=None: seen.append(list(context)) or offer(context, k, grammar)
    from toy import TrigramBackend, random_table

    target = TrigramBackend(random_table(len(words), 0, scale=2.0))
    s = stream(target, ids, GenerationConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=0.0)), drafter, 2)
    list(s)
    assert seen and seen[0][: len(ids)] == ids  # the suffix's tokens are in the drafter's context
