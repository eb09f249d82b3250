"""The tiny character-level base model for ``t0_arithmetic_format`` (recipe: measured-notes)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
# Every character the task and the pre-training format use; one token each.
CHARACTERS = "0123456789+=QA:# \n"

PRETRAIN_SEED = 1234
PRETRAIN_STEPS = 1000
PRETRAIN_BATCH = 128
PRETRAIN_LR = 3e-3
OPERAND_MAX = 19
TORCH_THREADS = 2


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character tokenizer: BPE without merges and without a pre-tokenizer splits text into chars."""
    vocab = {PAD_TOKEN: 0, EOS_TOKEN: 1, UNK_TOKEN: 2}
    for char in CHARACTERS:
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN
    )


def build_config(tokenizer: PreTrainedTokenizerFast, *, hidden: int = 128, layers: int = 3) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def _answer_only_batch(
    tokenizer: PreTrainedTokenizerFast, pairs: Sequence[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels); the loss sees only completion + eos."""
    encoded = [
        (tokenizer.encode(prompt), [*tokenizer.encode(completion), tokenizer.eos_token_id])
        for prompt, completion in pairs
    ]
    width = max(len(p) + len(c) for p, c in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    for row, (prompt_ids, completion_ids) in enumerate(encoded):
        n = len(prompt_ids) + len(completion_ids)
        ids[row, :n] = torch.tensor(prompt_ids + completion_ids)
        mask[row, :n] = 1
        labels[row, len(prompt_ids) : n] = torch.tensor(completion_ids)
    return ids, mask, labels


def pretrain_base_model(
    output_dir: Path, *, steps: int = PRETRAIN_STEPS, progress: Callable[[str], None] | None = None
) -> None:
    """Build and pre-train the base on ``a+b=`` -> ``s``: it knows sums, not the task's answer format."""
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(PRETRAIN_SEED)
    rng = random.Random(PRETRAIN_SEED)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(build_config(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
    # Linear decay to zero: the last steps settle the sums instead of bouncing around them.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    model.train()
    started = time.monotonic()
    for step in range(1, steps + 1):
        pairs = []
        for _ in range(PRETRAIN_BATCH):
            a, b = rng.randint(0, OPERAND_MAX), rng.randint(0, OPERAND_MAX)
            pairs.append((f"{a}+{b}=", str(a + b)))
        ids, mask, labels = _answer_only_batch(tokenizer, pairs)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if progress is not None and (step % 200 == 0 or step == steps):
            progress(
                f"pre-train step {step}/{steps} loss {loss.item():.4f} ({time.monotonic() - started:.0f}s)"
            )
    model.train(False)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
