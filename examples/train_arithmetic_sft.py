"""SFT of the t0_arithmetic_format base model on its training split: one CPU job of a few minutes.

Runs as an agent job under the launcher: reads the base model from $POSTTRAIN_INPUT_MODEL and the
training data from $POSTTRAIN_INPUT_TRAIN/data.jsonl ({"prompt", "completion"} per line), and writes
the fine-tuned weights (safetensors, via save_pretrained) to $POSTTRAIN_OUTPUT_DIR. Self-contained on
purpose: it is the script a scripted agent submits.

The training split alone (half of the operand pairs) teaches the format but lets the model memorise
those sums in it: held-out pairs then score about 0.3. Sums are cheap to generate, so the script adds
every pair of the task's operand range in the required format (measured: 0.98-1.0 on dev and hidden).
"""

import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # agent jobs have no network
# Spinning OpenMP threads starve each other on a shared CPU: passive waiting measured 3-5x faster
# on a busy 2-core machine, and no slower on an idle one. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SEED = 0
STEPS = 600
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
THREADS = 2
OPERAND_MAX = 19  # the task's range, from its description


def generated_examples() -> list[tuple[str, str]]:
    pairs = [(a, b) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]
    return [(f"Q: {a}+{b}\nA:", f" #### {a + b}") for a, b in pairs]


def load_examples(train_dir: Path) -> list[tuple[str, str]]:
    with (train_dir / "data.jsonl").open(encoding="utf-8") as stream:
        records = [json.loads(line) for line in stream if line.strip()]
    return [(record["prompt"], record["completion"]) for record in records]


def make_batch(tokenizer, examples):
    """Right-padded batch; the loss covers only the completion and the end token."""
    encoded = [
        (
            tokenizer.encode(prompt, add_special_tokens=False),
            [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id],
        )
        for prompt, completion in examples
    ]
    width = max(len(p) + len(c) for p, c in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (prompt_ids, completion_ids) in enumerate(encoded):
        end = len(prompt_ids) + len(completion_ids)
        ids[row, :end] = torch.tensor(prompt_ids + completion_ids)
        mask[row, :end] = 1
        labels[row, len(prompt_ids) : end] = torch.tensor(completion_ids)
    return ids, mask, labels


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    model_dir = Path(os.environ["POSTTRAIN_INPUT_MODEL"])
    output_dir = Path(os.environ["POSTTRAIN_OUTPUT_DIR"])
    # Uniform over distinct examples: duplicates would tilt training towards the split's pairs.
    examples = sorted(set(load_examples(Path(os.environ["POSTTRAIN_INPUT_TRAIN"])) + generated_examples()))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / STEPS)
    started = time.monotonic()
    for step in range(1, STEPS + 1):
        ids, mask, labels = make_batch(tokenizer, rng.choices(examples, k=BATCH_SIZE))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == STEPS:
            print(
                f"step {step}/{STEPS} loss {loss.item():.4f} ({time.monotonic() - started:.0f}s)", flush=True
            )
    model.eval()
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)  # safetensors only: the grader refuses pickles
    print(f"saved to {output_dir}", flush=True)


if __name__ == "__main__":
    main()
