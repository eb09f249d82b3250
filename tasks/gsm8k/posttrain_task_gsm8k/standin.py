"""The stand-in: GSM8K-format data the project generates, and a tiny causal LM in the standard Hugging
Face layout (Qwen3 architecture, safetensors, a byte-level BPE `tokenizer.json` with the task's chat
template), so every code path of the real task runs here with no Hub and no GPU.

The records have GSM8K's fields and answer form (`question`; `answer` with `<<a+b=c>>` calculator
notes and a final `#### <number>`). The model is untrained: it is what an agent's SFT starts from.
Every build is deterministic (seeded data, a tokenizer trained on that data, seeded weights).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

from posttrain_task_gsm8k.prompt import CHAT_TEMPLATE, render

SEED = 20_261_203
SPLIT_SIZES = {"train": 400, "dev": 50, "hidden": 100}
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jamal")
ITEMS = ("apples", "stickers", "marbles", "pencils", "cookies", "stamps", "books", "shells")
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 640
MODEL_SEED = 1234


def _problem(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        c = rng.randint(1, a + b - 1)
        s, r = a + b, a + b - c
        question = (
            f"{name} has {a} {item}. {name} buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {name} have now?"
        )
        answer = (
            f"After buying, {name} has {a} + {b} = <<{a}+{b}={s}>>{s} {item}.\n"
            f"After giving some away, {name} has {s} - {c} = <<{s}-{c}={r}>>{r} {item}.\n#### {r}"
        )
    elif kind == 1:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        r = a * b
        question = f"A box holds {a} {item}. {name} fills {b} boxes. How many {item} does {name} pack?"
        answer = f"{name} packs {a} * {b} = <<{a}*{b}={r}>>{r} {item}.\n#### {r}"
    else:
        a, b, c = rng.randint(5, 30), rng.randint(2, 8), rng.randint(1, 20)
        s, r = a * b, a * b + c
        question = (
            f"{name} earns ${a} an hour, works {b} hours and gets a ${c} tip. "
            f"How many dollars does {name} make?"
        )
        answer = (
            f"For the hours, {name} makes {a} * {b} = <<{a}*{b}={s}>>{s} dollars.\n"
            f"With the tip, that is {s} + {c} = <<{s}+{c}={r}>>{r} dollars.\n#### {r}"
        )
    return question, answer


def splits() -> dict[str, list[dict[str, str]]]:
    """Disjoint splits (no question twice), GSM8K's fields. `dev` is a held-out slice of what train
    is drawn from; `hidden` stands in for the test set."""
    rng = random.Random(SEED)
    seen: set[str] = set()
    result: dict[str, list[dict[str, str]]] = {}
    for split, size in SPLIT_SIZES.items():
        records: list[dict[str, str]] = []
        while len(records) < size:
            question, answer = _problem(rng)
            if question in seen:
                continue
            seen.add(question)
            records.append({"question": question, "answer": answer})
        result[split] = records
    return result


def _corpus() -> Iterator[str]:
    for records in splits().values():
        for record in records:
            yield render(record["question"]) + record["answer"] + "<|im_end|>\n"


def build_tokenizer(output_dir: Path) -> None:
    """A byte-level BPE trained on the stand-in's own text, saved with the task's chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token=END_OF_TEXT
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(output_dir)


def build_model(output_dir: Path, progress: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    build_tokenizer(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir, local_files_only=True)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(MODEL_SEED)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(output_dir)
    progress(f"stand-in model: {sum(p.numel() for p in model.parameters())} parameters")
