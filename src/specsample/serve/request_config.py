"""A request's parameters -> the GenerationConfig and the tasks the worker runs: the
one path that checks them.

The library's configs own their ranges; their InvalidSetting becomes a 400 that names
the request's parameter. Checked here is only what is the server's own: its caps
(max_tokens, n, prompts, stop strings, logit_bias entries), OpenAI's temperature
limit, the response_format, and whether each prompt fits the context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..backends.base import Backend, ChatTemplateError
from ..backends.fim_tokens import FimFormat
from ..decoding.context_fit import new_token_room
from ..decoding.generate import GenerationConfig, check_prompt
from ..decoding.sampling import InvalidSetting, SamplingConfig, bias_entry, check_range
from ..output.constraints import Constraint, ConstraintError
from ..output.fim import ExtraFile, fim_prompt
from ..policy.make import K_MAX, most_drafts
from .doors import header_value
from .errors import APIError, ClientGone
from .schemas import ChatRequest, CompletionRequest, GenerationRequest, InfillRequest, ResponseFormat, TokenizeRequest
from .settings import Settings
from .tool_requests import ToolPlan, template_messages, template_tools
from .worker import ChoiceTask

# OpenAI takes 4; the HumanEval completion protocol needs 5, and vLLM and llama-server
# set no limit. Each stop string is searched in the text after every round.
MAX_STOP_STRINGS = 16
MAX_CHOICES = 32  # prompts x n in one request; they take turns on the model like separate requests
MAX_LOGIT_BIAS = 300  # OpenAI's limit
MAX_TEMPERATURE = 2  # OpenAI's limit; the library takes any temperature >= 0

Prompt = tuple[list[int], str | None]  # token ids, and the text when it came as text (for echo)


@dataclass
class RequestPlan:
    """What a request asks for, checked; max_new_tokens is fitted to each prompt later."""

    config: GenerationConfig | None  # None: nothing to generate (echo with max_tokens 0: the prompt is only scored)
    requested: int | None  # max_tokens as asked; None: as many as fit
    logprobs: int | None  # alternatives per token; None: none asked for
    n: int
    echo: bool
    budget: int  # the most tokens one request may ask for: every choice's max_tokens, and the prompts echo scores
    warm: bool = False  # nothing to generate, but the prompt goes into a slot's cache for the next request to reuse
    k_max: int = K_MAX  # the most drafts the server's policy adds in a round: room the context must leave


def plan(request: GenerationRequest, settings: Settings, vocab_size: int, tools: ToolPlan | None = None) -> RequestPlan:
    """`tools`: a chat request's (tool_requests.tool_plan), whose grammar the answer follows."""
    chat = isinstance(request, ChatRequest)
    requested = request.max_tokens
    if chat and request.max_completion_tokens is not None:
        requested = request.max_completion_tokens
    echo = isinstance(request, CompletionRequest) and request.echo
    try:
        if isinstance(request, (InfillRequest, ChatRequest)):
            requested = editor_max_tokens(request, requested, settings)
        return _plan(request, requested, echo, settings, vocab_size, tools)
    except InvalidSetting as e:
        param = {"max_new_tokens": "max_tokens", "stop_strings": "stop",
                 "logprobs": "top_logprobs" if chat else "logprobs"}.get(e.field, e.field)
        raise APIError(400, e.message(param), param=param, code="invalid_value") from None
    except ValueError as e:  # a config's check without a field of its own
        raise APIError(400, str(e)) from None


def _plan(request: GenerationRequest, requested: int | None, echo: bool, settings: Settings,
          vocab_size: int, tools: ToolPlan | None) -> RequestPlan:
    if request.temperature is not None:
        check_range("temperature", request.temperature, 0, MAX_TEMPERATURE)
    if requested is not None:  # 0: nothing generated (echo's prompt scores; /infill's n_predict 0)
        warm_up = isinstance(request, InfillRequest) or isinstance(request, ChatRequest) and request.n_predict == 0
        check_range("max_tokens", requested, 0 if echo or warm_up else 1,
                    settings.max_tokens)
    if request.n is not None:
        check_range("n", request.n, 1, MAX_CHOICES)
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if len(stop) > MAX_STOP_STRINGS or not all(stop):
        raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop",
                       code="invalid_value")
    sampling = SamplingConfig(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=request.top_k or 0, top_p=1.0 if request.top_p is None else request.top_p,
        min_p=request.min_p or 0.0, presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
        logit_bias=logit_bias(request.logit_bias, vocab_size),
    )
    logprobs = requested_logprobs(request)
    # Built even when nothing is generated: its checks (logprobs, seed) hold for scoring too.
    config = GenerationConfig(max_new_tokens=requested or settings.max_tokens, sampling=sampling,
                              seed=request.seed, stop_strings=tuple(stop), verifier=settings.verifier,
                              logprobs=logprobs,
                              cache_prompt=settings.cache_prompt if request.cache_prompt is None
                              else request.cache_prompt,
                              logprobs_mode=request.logprobs_mode or "raw",
                              constraint=tools.constraint if tools is not None and tools.constraint is not None
                              else response_constraint(request.response_format))
    # max_tokens 0 with cache_prompt: llama.vim's warm-up, which readies a slot's cache
    # with the text its next requests start with.
    warm = requested == 0 and config.cache_prompt and not echo
    return RequestPlan(None if requested == 0 else config, requested, logprobs, request.n or 1, echo,
                settings.request_budget, warm, most_drafts(settings.policy))


def response_headers(plan: RequestPlan) -> dict[str, str]:
    """The schema parts a lenient response_format left unenforced, as a header (on
    whole and streamed answers alike; OpenAI's body has no field for it)."""
    constraint = plan.config.constraint if plan.config is not None else None
    if constraint is None or not constraint.unenforced:
        return {}
    return {UNENFORCED_HEADER: header_value("; ".join(constraint.unenforced))}


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    """Token ids come as strings of ASCII digits; the entries are checked by sampling's rule."""
    if not bias:
        return {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}",
                       param="logit_bias", code="invalid_value")
    return dict(bias_entry(key, value, vocab_size) for key, value in bias.items())


def requested_logprobs(request: GenerationRequest) -> int | None:
    """Alternatives per token, or None when no log-probabilities are asked for
    (GenerationConfig checks the range)."""
    if isinstance(request, CompletionRequest):
        return request.logprobs
    if not isinstance(request, ChatRequest):  # /infill: none
        return None
    if request.top_logprobs and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return (request.top_logprobs or 0) if request.logprobs else None


UNENFORCED_HEADER = "X-Specsample-Unenforced-Schema"


def response_constraint(response_format: ResponseFormat | None) -> Constraint | None:
    """OpenAI's response_format: text, any JSON object, or JSON under a schema.
    `strict: true` refuses (400) a schema with keywords the grammar engine does not
    implement, so the output follows the whole schema; `strict: false` (the default,
    as OpenAI's) enforces the rest and lets those parts go unenforced: the output may
    break them, and the response's UNENFORCED_HEADER names them (response_headers)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Constraint.json_object()
    spec = response_format.json_schema
    if spec is None:
        raise APIError(400, "response_format.json_schema is required when the type is json_schema",
                       param="response_format.json_schema", code="missing_required_parameter")
    try:
        return Constraint.json_schema(spec.schema_ or {"type": "object"}, strict=bool(spec.strict))
    except ConstraintError as e:
        raise APIError(400, f"response_format.json_schema.schema: {e}", param="response_format.json_schema.schema",
                       code="invalid_value") from None


# ---- prompts ----------------------------------------------------------------------

def completion_prompts(request: CompletionRequest, target: Backend, left: Callable[[], bool] = lambda: False
                       ) -> list[Prompt]:
    """Each prompt's ids; with a non-empty suffix, each text prompt is the prefix of a
    fill-in-the-middle prompt (an empty one too: the cursor at the start of a file)."""
    prompt = request.prompt
    if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
        prompts = [prompt]  # one text, or one list of token ids
    else:
        prompts = prompt
    if not prompts:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(prompts) > MAX_CHOICES:
        raise APIError(400, f"at most {MAX_CHOICES} prompts per request, got {len(prompts)}", param="prompt")
    if request.suffix:
        return [(suffix_prompt(request, p, target), None) for p in prompts]
    out = []
    for p in prompts:
        if left():  # up to 32 prompts of a MiB: stop once nobody waits for them
            raise ClientGone()
        if isinstance(p, list):  # token ids
            if not p or not all(0 <= t < target.vocab_size for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {target.vocab_size}), at least one",
                               param="prompt")
            out.append((list(p), None))
            continue
        try:
            check_prompt(p)  # the library's rule, as the command line applies it
        except ValueError as e:
            raise APIError(400, str(e), param="prompt") from None
        out.append((target.tokenizer.encode(p), p))
    return out


def suffix_prompt(request: CompletionRequest, prompt: str | list[int], target: Backend) -> list[int]:
    if request.echo:  # OpenAI refuses the two together: the echo would not be the text the model read
        raise APIError(400, "echo and suffix cannot be used together", param="echo", code="invalid_value")
    if not isinstance(prompt, str):
        raise APIError(400, "a prompt with a suffix must be text, not token ids", param="prompt")
    return fim_prompt(require_fim(target, "suffix"), target.tokenizer.text_ids, prompt, request.suffix)


def infill_prompts(request: InfillRequest, target: Backend, left: Callable[[], bool] = lambda: False) -> list[Prompt]:
    """llama-server's /infill prompt: input_extra, then prefix (and prompt), suffix, middle.
    Its pieces are tokenized one by one, and the building stops as soon as they cannot fit
    the context or the client has left (`left`): a request of many files holds the
    tokenizer thread for about a context's worth of text at most."""
    fim = require_fim(target, "input_suffix")
    extra = [ExtraFile(chunk.filename, chunk.text) for chunk in request.input_extra]
    pieces = Pieces(target.tokenizer.text_ids, target.context_length, left, "input_extra" if extra else "input_prefix")
    return [(fim_prompt(fim, pieces, request.input_prefix, request.input_suffix, extra, request.prompt), None)]


class Pieces:
    """text_ids for a prompt built piece by piece, which gives up once the pieces hold
    more tokens than the context (a 400 naming `param`) or the client has left."""

    def __init__(self, text_ids: Callable[[str], list[int]], context: int, left: Callable[[], bool], param: str):
        self.text_ids, self.context, self.left, self.param = text_ids, context, left, param
        self.count = 0

    def __call__(self, text: str) -> list[int]:
        if self.left():
            raise ClientGone()
        ids = self.text_ids(text)
        self.count += len(ids)
        if self.count > self.context:
            raise APIError(400, f"the prompt has more than {self.context} tokens, this model's context",
                           param=self.param, code="context_length_exceeded")
        return ids


def require_fim(target: Backend, param: str) -> FimFormat:
    if target.fim is None:
        raise APIError(400, f"{param}: this model has no fill-in-the-middle tokens (prefix, suffix and middle) in its "
                       f"vocabulary, so it cannot fill in a middle", param=param, code="fim_unsupported")
    return target.fim


def editor_max_tokens(request: InfillRequest | ChatRequest, requested: int | None, settings: Settings) -> int | None:
    """max_tokens as llama-server's clients ask it: n_predict is its name for it, -1 (its
    default) as many as fit; /infill gives one answer only, as its shape has room for."""
    if isinstance(request, InfillRequest) and request.n is not None and request.n != 1:
        raise APIError(400, "/infill gives one answer: n must be 1", param="n", code="invalid_value")
    if request.n_predict is None or request.n_predict == -1:
        return requested
    if requested is not None and requested != request.n_predict:
        raise APIError(400, "n_predict and max_tokens are one setting; give one", param="n_predict",
                       code="invalid_value")
    check_range("n_predict", request.n_predict, 0, settings.max_tokens)  # 0: the prompt alone
    return request.n_predict


def chat_prompts(request: ChatRequest, target: Backend, left: Callable[[], bool] = lambda: False) -> list[Prompt]:
    return [(chat_prompt(request, target, left), None)]


def chat_prompt(request: ChatRequest | TokenizeRequest, target: Backend, left: Callable[[], bool] = lambda: False
                ) -> list[int]:
    """The chat's ids; building them stops between messages once the client has left (`left`)."""
    def check():
        if left():
            raise ClientGone()

    messages = template_messages(request.messages)
    try:
        return target.tokenizer.chat_messages(messages, template_tools(request.tools), check=check)
    except ChatTemplateError as e:  # the template refused these messages (raise_exception)
        raise APIError(400, str(e), param="messages") from None
    except ValueError as e:  # no chat template
        raise APIError(400, f"{e}; use /v1/completions", param="messages") from None


# ---- prompts x n -> tasks ---------------------------------------------------------

def make_choices(plan: RequestPlan, prompts: list[Prompt], context_length: int, param: str) -> list[ChoiceTask]:
    """One task per choice: n samples of each prompt, each fitted to the context, with
    seeds seed, seed + 1, ... (each sample reproducible alone)."""
    if len(prompts) * plan.n > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x n = {plan.n} asks for more than {MAX_CHOICES} choices",
                       param="n", code="invalid_value")
    out = []
    for p, (ids, _) in enumerate(prompts):
        fitted = fit_context(plan, len(ids), context_length, param)
        for i in range(plan.n):
            seeded = None if fitted is None else dataclasses.replace(fitted, seed=_nth_seed(fitted.seed, i))
            out.append(ChoiceTask(p * plan.n + i, ids, seeded, plan.logprobs if plan.echo else None, plan.warm))
    check_budget(out, plan.budget)
    return out


def check_budget(tasks: list[ChoiceTask], budget: int) -> None:
    """The single worker serves one request at a time, so one asking for n x prompts x
    max_tokens would hold everyone else for as long: its generated tokens (each
    choice's max_tokens, fitted to the context) and the prompt tokens echo scores must
    fit the server's --max-request-tokens."""
    generated = sum(t.config.max_new_tokens for t in tasks if t.config is not None)
    scored = sum(len(t.prompt_ids) for t in tasks if t.prompt_logprobs is not None)
    if generated + scored > budget:
        raise APIError(400, f"this request asks for up to {generated + scored} tokens ({len(tasks)} choices: "
                       f"{generated} to generate, {scored} prompt tokens to score), over this server's limit of "
                       f"{budget} per request (--max-request-tokens); ask for fewer choices or a smaller max_tokens",
                       param="max_tokens", code="request_too_large")


def fit_context(plan: RequestPlan, prompt_length: int, context: int, param: str) -> GenerationConfig | None:
    """The config with max_new_tokens fitted to what the prompt leaves of the context
    (context_fit's rule, which stream() checks too); a prompt or max_tokens that
    cannot fit is a 400."""
    config = plan.config
    if config is None:  # scoring alone
        if prompt_length > context:
            raise APIError(400, f"the prompt has {prompt_length} tokens, but this model's context takes at most "
                           f"{context}", param=param, code="context_length_exceeded")
        return None
    room = new_token_room(context, prompt_length, plan.k_max)
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_length} tokens, but this model's context of {context} tokens "
                       f"takes prompts of at most {prompt_length + room - 1}", param=param,
                       code="context_length_exceeded")
    if plan.requested is not None and plan.requested > room:
        raise APIError(400, f"max_tokens {plan.requested} does not fit: the prompt has {prompt_length} tokens, which "
                       f"leaves room for {room} in this model's context of {context} tokens",
                       param="max_tokens", code="context_length_exceeded")
    return dataclasses.replace(config, max_new_tokens=min(room, config.max_new_tokens))


def _nth_seed(seed: int | None, i: int) -> int | None:
    if seed is None:
        return None
    return seed + i if seed + i < 1 << 64 else seed - i
