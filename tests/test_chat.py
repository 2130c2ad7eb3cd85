"""Chat templates: one function puts a prompt in front of a model; a template's own BOS is not
doubled by a tokenizer that adds one; `rlvr train --model DIR` trains and evaluates templated
prompts and records them as the model saw them."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlvr.cli import main
from rlvr.models.chat import adds_bos, format_prompt, format_rows
from rlvr.models.tiny import build_char_tokenizer
from rlvr.report.run_dir import read_jsonl

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}\n{{ m.content }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained here on arithmetic text, whose post-processor
    adds BOS (as Llama's does), with a Llama-3-style chat template that writes BOS too."""
    specials = ["<unk>", "<s>", "</s>", "<|start|>", "<|end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [
        f"{a}+{b}={a + b} #### {a + b} user assistant system" for a in range(99) for b in (7, 38)
    ]
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = LLAMA3_STYLE
    return fast


def templated_model_dir(tmp_path) -> str:
    """A 1-layer Llama saved with `bpe_tokenizer()` (template and BOS-adding post-processor)."""
    tok = bpe_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def test_the_templated_prompt_carries_exactly_one_bos():
    tok = bpe_tokenizer()
    assert adds_bos(tok)
    text = format_prompt(tok, "12+30=", chat_template=True)
    assert text == "<|start|>user\n12+30=<|end|><|start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    # without the fix the template's BOS and the tokenizer's would both be there
    raw = tok.apply_chat_template([{"role": "user", "content": "12+30="}], tokenize=False)
    assert tok(raw)["input_ids"].count(tok.bos_token_id) == 2


def test_a_system_prompt_comes_first_and_no_template_leaves_prompts_alone():
    tok = bpe_tokenizer()
    text = format_prompt(tok, "1+1=", chat_template=True, system="Answer as #### N.")
    assert text.startswith("<|start|>system\nAnswer as #### N.<|end|><|start|>user\n1+1=")
    assert format_prompt(tok, "1+1=", chat_template=False) == "1+1="
    char = build_char_tokenizer()  # the lab's tokenizer has no template
    rows = [{"prompt": "1+1=", "answer": "2"}]
    assert format_rows(char, rows, chat_template=True) is rows


def test_format_rows_keeps_columns_and_the_kind_of_collection():
    tok = bpe_tokenizer()
    rows = [{"prompt": "1+1=", "answer": "2"}]
    listed = format_rows(tok, rows, chat_template=True)
    assert isinstance(listed, list) and listed[0]["answer"] == "2"
    assert listed[0]["prompt"] == format_prompt(tok, "1+1=", chat_template=True)
    streamed = format_rows(tok, iter(rows), chat_template=True)
    assert not isinstance(streamed, list) and next(streamed) == listed[0]


def test_train_on_a_templated_model_records_the_prompts_it_saw(tmp_path, capsys):
    model_dir = templated_model_dir(tmp_path)
    runs = tmp_path / "runs"
    args = ["--model", model_dir, "--runs-dir", str(runs), "--run-name", "chat"]
    small = ["--arithmetic.digits", "2", "--arithmetic.held-out-size", "4", "--eval-samples", "1"]
    grpo = ["--grpo.steps", "1", "--grpo.prompts-per-step", "2", "--grpo.group-size", "2"]
    main(["train", *args, *small, *grpo, "--grpo.max-new-tokens", "32", "--no-progress"])
    samples = read_jsonl(runs / "chat" / "samples.jsonl")
    assert samples and all(s["prompt"].startswith("<|start|>user\n") for s in samples)
    assert all(s["prompt"].endswith("<|start|>assistant\n") for s in samples)
    assert "eval/greedy_acc" in read_jsonl(runs / "chat" / "metrics.jsonl")[0]


def test_few_shot_examples_come_as_earlier_turns_after_the_system_prompt():
    tok = bpe_tokenizer()
    examples = [("What is 1+2?", "1+2 = 3\n#### 3"), ("What is 5+5?", "5+5 = 10\n#### 10")]
    rows = format_rows(tok, [{"prompt": "What is 7+7?"}], True, "Be brief.", examples)
    assert rows[0]["prompt"] == (
        "<|start|>system\nBe brief.<|end|>"
        "<|start|>user\nWhat is 1+2?<|end|><|start|>assistant\n1+2 = 3\n#### 3<|end|>"
        "<|start|>user\nWhat is 5+5?<|end|><|start|>assistant\n5+5 = 10\n#### 10<|end|>"
        "<|start|>user\nWhat is 7+7?<|end|><|start|>assistant\n"
    )
    assert tok(rows[0]["prompt"])["input_ids"].count(tok.bos_token_id) == 1


def test_few_shot_examples_are_correct_training_problems_never_held_out():
    from rlvr.pipelines.common import few_shot_examples
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig, task_spec

    task = task_spec(ArithmeticTaskConfig(digits=2, style="question", held_out_size=50))
    examples = few_shot_examples(task, 3)
    assert examples == few_shot_examples(task, 3) and len(examples) == 3
    held_out = {r["prompt"] for r in task.held_out_rows()}
    for prompt, solution in examples:
        assert prompt not in held_out
        a, b = map(int, prompt.removeprefix("What is ").removesuffix("?").split("+"))
        assert solution == f"{a}+{b} = {a + b}\n#### {a + b}"
    assert few_shot_examples(task, 0) == []


def test_few_shot_without_a_chat_template_warns_that_it_is_unused(tmp_path, capsys):
    from tests.test_lab import TINY

    runs = ["--runs-dir", str(tmp_path / "runs"), "--run-name", "fs", "--cache-dir", str(tmp_path)]
    main(["train", *TINY, *runs, "--few-shot", "2", "--grpo.steps", "1"])
    assert "--few-shot 2 needs a chat template" in capsys.readouterr().err


def test_eval_puts_few_shot_turns_in_front_of_the_prompts_as_train_does(tmp_path, monkeypatch):
    import rlvr.train.evaluate as evaluate_module

    model_dir = templated_model_dir(tmp_path)
    seen = []

    def fake_accuracy(model, tokenizer, rows, *args, **kwargs):
        seen.extend(r["prompt"] for r in rows)
        return 0.0

    monkeypatch.setattr(evaluate_module, "held_out_accuracy", fake_accuracy)
    task = ["--arithmetic.digits", "2", "--arithmetic.style", "question"]
    main(["eval", "--model", model_dir, *task, "--arithmetic.held-out-size", "4"])
    main(
        ["eval", "--model", str(model_dir), *task, "--arithmetic.held-out-size", "4"]
        + [
            "--few-shot",
            "2",
        ]
    )
    plain, few = seen[:4], seen[4:]
    assert all(p.count("<|start|>user") == 1 for p in plain)
    assert all(p.count("<|start|>user") == 3 and "#### " in p for p in few)


def test_a_rows_own_messages_go_through_the_template():
    tok = bpe_tokenizer()
    messages = [{"role": "system", "content": "Use ####."}, {"role": "user", "content": "1+1="}]
    rows = [{"prompt": "Use ####.\n\n1+1=", "messages": messages, "answer": "2"}]
    # the row's own system message wins over the caller's; examples go before its user turn
    (row,) = format_rows(tok, rows, True, "Be brief.", [("2+2=", "#### 4")])
    assert row["prompt"] == (
        "<|start|>system\nUse ####.<|end|>"
        "<|start|>user\n2+2=<|end|><|start|>assistant\n#### 4<|end|>"
        "<|start|>user\n1+1=<|end|><|start|>assistant\n"
    )
    assert row["messages"] == messages and row["answer"] == "2"
    assert tok(row["prompt"])["input_ids"].count(tok.bos_token_id) == 1
    # without a system message of their own, the caller's comes first
    (row,) = format_rows(tok, [{"prompt": "1+1=", "messages": messages[1:]}], True, "Be brief.")
    assert row["prompt"] == format_prompt(tok, "1+1=", True, system="Be brief.")
    # no template: the joined text is the prompt, as the row has it
    char = build_char_tokenizer()
    assert format_rows(char, rows, chat_template=True) is rows
    assert format_rows(tok, rows, chat_template=False) is rows


def test_row_formatter_reads_the_prompt_of_a_row_without_messages():
    from rlvr.models.chat import row_formatter

    tok = bpe_tokenizer()
    fmt = row_formatter(tok, True, "Be brief.")
    assert fmt({"prompt": "1+1="}) == format_prompt(tok, "1+1=", True, system="Be brief.")
    assert row_formatter(build_char_tokenizer(), True)({"prompt": "1+1="}) == "1+1="
