"""`specsample check` on toy backends: a correct sampler passes, wrong ones fail, and
an engine whose logits depend on the call shape passes with its floor reported.

Vocabulary 6, three prompts, N = 2,000 samples in all: each run takes well under a
second. The verdict's bound is the check's own (the 99th percentile of a perfect
sampler's TV at the same N), so a correct sampler fails the check 1 time in 100 over
the seeds a run could draw: these tests never assert that a correct sampler PASSES.
They assert instead that its samples fit the check's reference cells (toy.assert_fits,
at the suite's false-alarm rate), that the report is consistent with its verdict, and
that wrong samplers FAIL (they miss by far more than the bound).
"""

import pytest
import torch

from specsample.app import check as check_module
from specsample.app.assemble import Models
from specsample.app.check import CheckConfig, check, total_variation
from specsample.cli import main
from specsample.decoding import rounds as rounds_module
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.sampling import SamplingConfig, logits_to_probs

from test_distribution import accept_everything, recover_from_target
from toy import TrigramBackend, assert_fits, random_table


pytestmark = pytest.mark.pure

VOCAB = 6
TARGET = random_table(VOCAB, seed=0)
DRAFT = random_table(VOCAB, seed=2)  # unrelated: frequent rejections
PROMPTS = [[1, 2], [3], [4, 5, 0]]
SAMPLING = SamplingConfig(temperature=1.0)
CONFIG = CheckConfig(samples=2000, sampling=SAMPLING)


def run_check(target=None, config=CONFIG, k=2):
    drafter = ModelDrafter(TrigramBackend(DRAFT, name="draft"), config.sampling)
    return check(target or TrigramBackend(TARGET), drafter, PROMPTS, config, policy=k)


def assert_cells_fit(result):
    """Each prompt's samples fit the check's own reference cells, "other" included."""
    for p in result.prompts:
        counts = {(i,): round(c.observed * p.samples) for i, c in enumerate(p.cells)}
        assert_fits(counts, {(i,): c.exact for i, c in enumerate(p.cells)}, p.samples)


def assert_verdict_printed(code, out):
    assert ("PASS" in out) != ("FAIL" in out)
    assert code == (0 if "PASS" in out else 1)  # a correct sampler fails 1 time in 100: either is right here


def test_a_correct_sampler_fits_the_reference_and_the_report_holds_together():
    result = run_check()
    assert_cells_fit(result)
    assert result.tv == pytest.approx(sum(p.tv for p in result.prompts) / len(result.prompts))
    assert result.perfect_tv[0] < result.perfect_tv[1] < 0.1
    assert result.engine_floor == 0.0  # the toy ignores call shapes
    for p in result.prompts:
        assert p.samples == 2000 // len(PROMPTS)
        assert p.cells[-1].tokens is None and len(p.cells) == CONFIG.cells + 1  # likeliest cells, then "other"
        assert sum(c.exact for c in p.cells) == pytest.approx(1.0)
        assert sum(c.observed for c in p.cells) == pytest.approx(1.0)
        assert [c.exact for c in p.cells[:-1]] == sorted((c.exact for c in p.cells[:-1]), reverse=True)
        assert 0.0 < p.acceptance_rate < 1.0


@pytest.mark.parametrize("k", [1, 3])
def test_exact_cells_follow_the_target(k):
    """The reference: P(x1) from the prompt row times P(x2 | x1), for any K."""
    result = run_check(config=CheckConfig(samples=300, sampling=SAMPLING), k=k)
    target = TrigramBackend(TARGET)
    for prompt, p in zip(PROMPTS, result.prompts):
        for cell in p.cells[:-1]:
            x1, x2 = cell.tokens
            first = logits_to_probs(target.next_logits(prompt)[None], SAMPLING)[0]
            second = logits_to_probs(target.next_logits(prompt + [x1])[None], SAMPLING)[0]
            assert cell.exact == pytest.approx(float(first[x1] * second[x2]), rel=1e-5)


@pytest.mark.parametrize("wrong_verify", [accept_everything, recover_from_target])
def test_a_wrong_sampler_fails(monkeypatch, wrong_verify):
    monkeypatch.setattr(rounds_module, "verify", wrong_verify)
    result = run_check()
    assert not result.passed
    assert result.tv > result.perfect_tv[1]
    with pytest.raises(AssertionError, match="fits the exact distribution"):
        assert_cells_fit(result)  # what the correct sampler's tests assert instead of PASS can fail


class CallShapeBackend(TrigramBackend):
    """Like llama.cpp: rows of a multi-token call differ from a one-token call's (here
    token 0 gets +bias logit), so batched scoring follows its own distribution."""

    bias = 0.5

    def score(self, token_ids, num_logits):
        logits = super().score(token_ids, num_logits)
        if len(token_ids) > 1:
            logits = logits.clone()
            logits[:, 0] += self.bias
        return logits


def test_an_engine_with_call_shape_dependent_logits_fits_with_its_floor_reported():
    result = run_check(CallShapeBackend(TARGET))
    assert_cells_fit(result)  # the reference is computed in the sampler's own call shapes
    # The floor is the TV that +0.5 on token 0 makes, at the likeliest first token.
    expected = []
    for prompt, p in zip(PROMPTS, result.prompts):
        row = TrigramBackend(TARGET).next_logits(prompt + [p.cells[0].tokens[0]])  # [vocab]
        shifted = row.clone()
        shifted[0] += 0.5
        expected.append(total_variation(torch.softmax(row, -1), torch.softmax(shifted, -1)))
    assert result.engine_floor == pytest.approx(max(expected), rel=1e-4)
    assert result.engine_floor > 0.01


def test_a_reference_in_the_wrong_call_shapes_would_fail(monkeypatch):
    """Why the shapes matter: with the reference from one-token calls (the toy's plain
    logits), the same correct sampler on the same engine fails."""
    exact_cells = check_module.exact_cells
    monkeypatch.setattr(check_module, "exact_cells",
                        lambda target, prompt, config, k: exact_cells(TrigramBackend(TARGET), prompt, config, k))
    assert not run_check(CallShapeBackend(TARGET)).passed


class Biased(TrigramBackend):
    """A target whose token-0 logit is off by 1.0 everywhere."""

    def next_logits(self, context):
        logits = super().next_logits(context).clone()
        logits[0] += 1.0
        return logits


def test_an_error_above_the_detectable_tv_fails_and_the_bound_shrinks_with_n(monkeypatch):
    """The reported bound means what it says: samples from a distribution whose mean
    TV from the reference (over the reported cells) exceeds it fail the check."""
    small, large = run_check(config=CheckConfig(samples=500, sampling=SAMPLING)), run_check()
    assert large.perfect_tv[1] < large.detectable < small.detectable
    assert large.detectable == pytest.approx(small.detectable / 2, rel=0.25)  # 4x the samples: half the TV
    exact_cells = check_module.exact_cells  # the reference from the true target, the samples from the biased one
    monkeypatch.setattr(check_module, "exact_cells",
                        lambda target, prompt, config, k: exact_cells(TrigramBackend(TARGET), prompt, config, k))
    wrong = run_check(Biased(TARGET))
    distance = []
    for prompt, p in zip(PROMPTS, wrong.prompts):
        first = logits_to_probs(Biased(TARGET).next_logits(prompt)[None], SAMPLING)[0]
        cells = [float(first[x1] * logits_to_probs(Biased(TARGET).next_logits(prompt + [x1])[None], SAMPLING)[0, x2])
                 for x1, x2 in (c.tokens for c in p.cells[:-1])]
        sampled = torch.tensor(cells + [1 - sum(cells)], dtype=torch.float64)
        distance.append(total_variation(sampled, torch.tensor([c.exact for c in p.cells], dtype=torch.float64)))
    assert sum(distance) / len(distance) > wrong.detectable
    assert not wrong.passed


# --- the command line, on the same toys ---------------------------------------

class ToyTokenizer:
    def encode(self, text):
        return [len(word) % VOCAB for word in text.split()]

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


class SlightlyShaped(CallShapeBackend):
    bias = 0.02  # a floor well below what a few thousand samples can see


@pytest.fixture(params=[TrigramBackend])
def toy_models(monkeypatch, request):
    def assemble(options, drafting=True):
        target = request.param(TARGET, name="toy-target")
        target.tokenizer = ToyTokenizer()
        return Models(target, TrigramBackend(DRAFT, name="toy-draft"), lookup=options.lookup)

    monkeypatch.setattr("specsample.app.check_cli.assemble", assemble)


def test_cli_prints_a_table_and_a_verdict(capsys, toy_models):
    code = main(["check", "--target", "toy", "--draft", "toy", "-n", "1500", "-k", "2"])
    out, err = capsys.readouterr()
    assert_verdict_printed(code, out + err)
    assert "target toy-target, draft toy-draft, k=2, temperature 1" in out
    assert "other" in out and "engine floor: TV 0.0000" in out
    assert "'<" in out  # tokens shown through the tokenizer
    assert "smallest TV this N detects: 0." in out and "warning" not in out


@pytest.mark.parametrize("toy_models", [SlightlyShaped], indirect=True)
def test_cli_warns_when_the_engine_floor_is_below_what_n_detects(capsys, toy_models):
    code = main(["check", "--target", "toy", "--draft", "toy", "-n", "1500"])
    out, _ = capsys.readouterr()
    assert_verdict_printed(code, out)
    floor = float(out.split("engine floor: TV ")[1].split()[0])
    detectable = float(out.split("smallest TV this N detects: ")[1].split()[0])
    assert 0 < floor < detectable
    assert "warning: the engine floor is below what 1500 samples can detect" in out
    suggested = int(out.split("roughly -n ")[1].split()[0])
    assert suggested == pytest.approx(1500 * (detectable / floor) ** 2, rel=0.1)  # the printed values are rounded


def test_cli_checks_auto_and_says_what_its_reference_is(capsys, toy_models):
    code = main(["check", "--target", "toy", "--draft", "toy", "-n", "300", "-k", "auto", "--k-max", "3"])
    out, err = capsys.readouterr()
    assert_verdict_printed(code, out + err)
    assert "k=auto" in out and "reference above uses one-token calls" in out
    assert "-k auto: the planner chose each round's length from this machine's timings" in out


def test_cli_exits_1_on_a_wrong_sampler(capsys, toy_models, monkeypatch):
    monkeypatch.setattr(rounds_module, "verify", accept_everything)
    code = main(["check", "--target", "toy", "--draft", "toy", "-n", "1500"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "FAIL" in out


@pytest.mark.parametrize("args,message", [
    (["--temperature", "0"], "temperature of at least 1e-05"),
    (["-k", "0"], "k must be 'auto' or an integer >= 1"),
    (["-n", "0"], "samples >= 1"),
    (["--lookup"], "without --lookup"),
])
def test_cli_refuses_bad_options_with_status_2(capsys, toy_models, args, message):
    code = main(["check", "--target", "toy", "--draft", "toy", *args])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err


def test_cli_end_to_end_on_tiny_transformers_models(capsys, tmp_path):
    from test_cli import WORDS, save_tiny

    words = ["[UNK]", "[EOS]"] + WORDS + [f"w{i}" for i in range(90 - 2 - len(WORDS))]
    target, draft = save_tiny(tmp_path / "target", 0, words), save_tiny(tmp_path / "draft", 7, words)
    code = main(["check", "--target", target, "--draft", draft, "--backend", "hf", "-n", "600"])
    out, err = capsys.readouterr()
    assert_verdict_printed(code, out + err)
    assert "engine floor" in out
