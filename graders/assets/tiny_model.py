"""The tiny character-level base model for ``t0_arithmetic_format`` (recipe: docs/tasks.md)."""

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
PRETRAIN_BATCH = 128
# 3e-3 (the rate first used) left the loss near 0.5 after 1,000 steps, with the level reached
# depending on the CPU's float kernels; at 1e-3 every sum is learned in a few hundred steps.
PRETRAIN_LR = 1e-3
PRETRAIN_MARGIN = 1.0  # logits by which the right token must lead every other, at every position
PRETRAIN_CHECK_EVERY = 50  # steps between margin checks (one forward pass over every sum)
PRETRAIN_MAX_STEPS = 5000  # a base that has not learned its sums by then is a build failure
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


def answer_only_batch(
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


def all_sums() -> list[tuple[str, str]]:
    return [(f"{a}+{b}=", str(a + b)) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]


@torch.no_grad()
def smallest_lead(model: LlamaForCausalLM, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> float:
    """Teacher-forced, over every answer position of every example: the smallest lead of the right
    token's logit over the best other one (positive everywhere means greedy decoding is right)."""
    ids, mask, labels = batch
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    safe_targets = targets.clamp(min=0)[..., None]
    right = logits.gather(2, safe_targets).squeeze(2)
    others = logits.scatter(2, safe_targets, float("-inf")).amax(dim=2)
    return float((right - others)[targets != -100].min())


def pretrain_base_model(
    output_dir: Path, *, margin: float = PRETRAIN_MARGIN, progress: Callable[[str], None] | None = None
) -> None:
    """Build and pre-train the base on ``a+b=`` -> ``s``: it knows sums, not the task's answer format.

    Trains until the base knows every sum of the task's range by `margin` logits, not for a fixed
    number of steps: the weights still depend on the CPU's float kernels, but what the base knows
    does not, so the fine-tunes that start from it behave alike on every machine.
    """
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(PRETRAIN_SEED)
    rng = random.Random(PRETRAIN_SEED)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(build_config(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
    sums = all_sums()
    every_sum = answer_only_batch(tokenizer, sums)
    model.train()
    started = time.monotonic()
    lead = float("-inf")
    for step in range(1, PRETRAIN_MAX_STEPS + 1):
        ids, mask, labels = answer_only_batch(tokenizer, rng.choices(sums, k=PRETRAIN_BATCH))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % PRETRAIN_CHECK_EVERY:
            continue
        model.train(False)
        lead = smallest_lead(model, every_sum)
        model.train()
        if progress is not None:
            progress(
                f"pre-train step {step} loss {loss.item():.4f} smallest lead {lead:.2f} "
                f"({time.monotonic() - started:.0f}s)"
            )
        if lead >= margin:
            break
    else:
        raise RuntimeError(
            f"the base model did not learn every sum in {PRETRAIN_MAX_STEPS} steps "
            f"(smallest lead {lead:.2f} < {margin})"
        )
    model.train(False)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
