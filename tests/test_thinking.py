import pytest
import torch

from rlvr.models.tiny import TinyModelConfig, build_tiny_model
from rlvr.report.plots import format_table, plot_thinking_budget
from rlvr.rollout.thinking import generate_with_thinking_budget
from rlvr.tasks.reasoning import score
from rlvr.train.evaluate import think_mode_check, thinking_budget_curve
from rlvr.verifiers.format import THINK_CLOSE, THINK_OPEN
from tests.test_sampler import EOS, TOKENIZER, MarkovModel, chain, ids

OPEN, CLOSE = ids("<think>")[0], ids("</think>")[0]
TAGS = {"think_open": THINK_OPEN, "think_close": THINK_CLOSE}


def thinker(thought: str, close: bool = True) -> MarkovModel:
    """Deterministic: after "=" it writes "<think>", then `thought`, then (if `close`)
    "</think>7" and EOS; without `close` it ends the thought with EOS. After a forced "</think>"
    it answers "7" too. `thought` must not repeat a character (the model sees one token)."""
    t = ids(thought)
    table = {ids("=")[0]: OPEN, OPEN: t[0], **chain(thought), ids("7")[0]: EOS, CLOSE: ids("7")[0]}
    table[t[-1]] = CLOSE if close else EOS
    return MarkovModel(table)


@pytest.mark.parametrize(
    "budget, completion, thinking, total, forced",
    [
        (None, "<think>abc</think>7", 3, 7, False),  # <think> abc </think> 7 EOS
        (5, "<think>abc</think>7", 3, 7, False),
        (3, "<think>abc</think>7", 3, 7, False),  # exactly the budget: the model closes itself
        (2, "<think>ab\n</think>7", 2, 7, True),  # cut after 2, stop phrase + close forced
        (1, "<think>a\n</think>7", 1, 6, True),
        (0, "<think></think>7", 0, 4, True),  # no-think: an empty block, no stop phrase
    ],
)
def test_budget_forcing_by_hand(budget, completion, thinking, total, forced):
    batch = generate_with_thinking_budget(
        thinker("abc"),
        TOKENIZER,
        ["1+2=", "34+5="],
        budget,
        max_answer_tokens=4,
        temperature=0.0,
        num_samples=2,
        **TAGS,
    )
    assert batch.completions == [completion] * 4
    assert batch.thinking_tokens == [thinking] * 4
    assert batch.total_tokens == [total] * 4
    assert batch.forced == [forced] * 4
    assert [score(c, "7") for c in batch.completions] == [1.0] * 4


def test_a_thought_that_ends_without_closing_is_left_unclosed():
    batch = generate_with_thinking_budget(
        thinker("ab", close=False),
        TOKENIZER,
        ["1+2="],
        4,
        max_answer_tokens=4,
        temperature=0.0,
        **TAGS,
    )
    assert batch.completions == ["<think>ab"]
    assert (batch.thinking_tokens, batch.total_tokens, batch.forced) == ([2], [4], [False])
    stop = generate_with_thinking_budget(
        thinker("abc"), TOKENIZER, ["1+2="], 2, 4, 0.0, stop_phrase="ok", **TAGS
    )
    assert stop.completions == ["<think>abok</think>7"]


@pytest.mark.parametrize("budget", [0, 3, 7, None])
def test_any_model_respects_the_budget(budget):
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=0)
    # a random model closes its thought at once sometimes: push "</think>" up so both happen
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOKENIZER)))
    model.lm_head.bias.data[CLOSE] = 3.0
    batch = generate_with_thinking_budget(
        model,
        TOKENIZER,
        ["12+34=", "5+6="],
        budget,
        max_answer_tokens=5,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        num_samples=8,
        **TAGS,
    )
    assert len(batch.completions) == 16
    for text, thinking, total, forced in zip(
        batch.completions, batch.thinking_tokens, batch.total_tokens, batch.forced
    ):
        tokens = ids(text)
        assert tokens[0] == OPEN
        assert budget is None or thinking <= budget
        assert total - len(tokens) in (0, 1)  # EOS, unless the answer was cut off
        if forced and budget:
            assert tokens[1 + thinking : 3 + thinking] == ids("\n</think>")
            assert thinking == budget
        elif CLOSE in tokens[1:]:
            assert tokens.index(CLOSE) == 1 + thinking
        if budget == 0:
            assert text.startswith("<think></think>") and forced
    if budget == 3:
        assert 0 < sum(batch.forced) < 16  # both paths were exercised


def test_budget_curve_table_plot_and_mode_check(tmp_path):
    rows = [{"prompt": "1+2=", "answer": "7"}, {"prompt": "/no_think 3+4=", "answer": "7"}]
    curve = thinking_budget_curve(
        thinker("abc"),
        TOKENIZER,
        rows,
        lambda c, r: score(c, r["answer"]),
        budgets=[0, 2, 3, None],
        max_answer_tokens=3,
    )
    assert [p["accuracy"] for p in curve] == [1.0] * 4
    assert [p["thinking_tokens"] for p in curve] == [0, 2, 3, 3]
    assert [p["total_tokens"] for p in curve] == [4, 7, 7, 7]
    assert [p["forced_frac"] for p in curve] == [1, 1, 0, 0]
    table = format_table(curve)
    assert "| none | 1.000 | 3.0 | 7.0 | 0.00 |" in table
    assert plot_thinking_budget(curve, tmp_path / "budget.png").stat().st_size > 0
    check = think_mode_check(
        thinker("abc"),
        TOKENIZER,
        rows,
        lambda c, r: score(c, r["answer"]),
        8,
        modes=("think", "no_think"),
    )
    # this model ignores the tag: it thinks in both modes
    assert check["no_think"] == {"accuracy": 1.0, "thinking_frac": 1.0, "mean_tokens": 7.0}
