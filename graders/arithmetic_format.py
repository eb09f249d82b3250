"""Grader of `t0_arithmetic_format`: greedy exact match of ` #### <sum>` on a split."""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from graders.assets.datasets import read_jsonl
from graders.checkpoint import load_strict
from graders.checkpoint_files import InvalidCheckpoint
from graders.inputs import GraderInputs
from graders.result import GraderResult
from graders.scoring import exact_match_accuracy
from graders.tasks import DATASET_FILE, Task

GRADER_VERSION = "arithmetic_format/2"
# " #### " plus at most a few digits and the end token; a longer answer is wrong anyway.
MAX_NEW_TOKENS = 12
TORCH_THREADS = 2


def greedy_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str]
) -> list[str]:
    """Greedy completions, cut at the end token. Prompts are batched by token length, so no padding
    (and no padding-dependent behaviour) ever enters the evaluation."""
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    by_length: dict[int, list[int]] = defaultdict(list)
    encoded = [tokenizer.encode(prompt, add_special_tokens=False) for prompt in prompts]
    for index, ids in enumerate(encoded):
        by_length[len(ids)].append(index)
    completions = [""] * len(prompts)
    with torch.no_grad():
        for indices in by_length.values():
            batch = torch.tensor([encoded[index] for index in indices], dtype=torch.long)
            # nn.Module.__getattr__ hides the GenerationMixin signature from mypy.
            generated = model.generate(  # type: ignore[operator]
                input_ids=batch,
                attention_mask=torch.ones_like(batch),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=eos_id,
                pad_token_id=pad_id,
            )
            for row, index in enumerate(indices):
                new_ids = generated[row, batch.shape[1] :].tolist()
                if eos_id in new_ids:
                    new_ids = new_ids[: new_ids.index(eos_id)]
                completions[index] = str(tokenizer.decode(new_ids, skip_special_tokens=False))
    return completions


def grade(task: Task, inputs: GraderInputs) -> GraderResult:
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(0)
    if inputs.base_model is None:
        raise RuntimeError(f"task {task.name} needs its base model as a grader input")
    records = read_jsonl(inputs.split / DATASET_FILE)
    try:
        model, tokenizer = load_strict(inputs.base_model, inputs.checkpoint)
    except InvalidCheckpoint as exc:
        return GraderResult.invalid_checkpoint(str(exc), GRADER_VERSION)
    completions = greedy_completions(model, tokenizer, [str(record["prompt"]) for record in records])
    accuracy, correct, formatted = exact_match_accuracy(
        completions, [str(record["answer"]) for record in records]
    )
    return GraderResult(
        score=accuracy,
        n=len(records),
        status="ok",
        details={"correct": correct, "well_formatted": formatted},
        grader_version=GRADER_VERSION,
    )
