"""Grader of `gsm8k`: sampled completions in batches, seeded per question, scored by strict match.

The model is the base's architecture, config and tokenizer with the checkpoint's tensors only
(`graders.checkpoint.load_strict`); the prompt and chat template are the task's. With vLLM importable
and a GPU present it generates with vLLM; otherwise with transformers, by a decode loop of its own in
which each question draws from its own generator, so a question's completion does not depend on which
others share its batch. The score job grades the whole hidden split over `seeds` seeds and reports a
bootstrap 95% interval; a dev job grades a seeded sample of `DEV_QUESTIONS` questions with one seed.
"""

from __future__ import annotations

import importlib.util
import random
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from graders.assets.datasets import read_jsonl
from graders.checkpoint import load_strict
from graders.checkpoint_files import InvalidCheckpoint, checkpoint_root
from graders.inputs import GraderInputs
from graders.result import GraderResult
from graders.tasks import DATASET_FILE, Task
from posttrain_task_gsm8k import DEV_QUESTIONS
from posttrain_task_gsm8k.prompt import STOP, TEMPERATURE, TOP_P, cut_at_stop, render
from posttrain_task_gsm8k.scoring import grade as grade_completion
from posttrain_task_gsm8k.statistics import seed_mean_with_interval

GRADER_VERSION = "gsm8k/1"
# The score is the mean over this many seeds; a dev evaluation uses one, on DEV_QUESTIONS of dev.
SEEDS = 3
MAX_NEW_TOKENS = 512
BATCH_SIZE = 32
TORCH_THREADS = 2
DEV_SAMPLE_SEED = 7
MAX_IGNORED_NAMES = 5


def question_seed(seed: int, index: int) -> int:
    return seed * 1_000_003 + index


def _top_p_sample(logits: torch.Tensor, generator: torch.Generator) -> int | None:
    """One token drawn from `logits` (on their device, with that device's generator); None when the
    logits are not finite (an agent's weights can overflow in a matmul): the answer then ends there."""
    if not bool(torch.isfinite(logits).all()):
        return None
    probs = torch.softmax(logits.float() / TEMPERATURE, dim=-1)
    ordered, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(ordered, dim=-1) - ordered < TOP_P  # always keeps the most likely token
    ordered = torch.where(keep, ordered, torch.zeros_like(ordered))
    choice = torch.multinomial(ordered / ordered.sum(), 1, generator=generator)
    return int(order[choice].item())


def stop_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokens that end an answer: the end of the assistant's turn, and the model's end of text."""
    end_of_turn = tokenizer.convert_tokens_to_ids(STOP[0])
    if not isinstance(end_of_turn, int) or end_of_turn == tokenizer.unk_token_id:
        raise RuntimeError(f"the base model's tokenizer has no {STOP[0]!r} token")
    eos = tokenizer.eos_token_id
    return {end_of_turn} | ({eos} if isinstance(eos, int) else set())


def encode(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> list[list[int]]:
    """The prompts' tokens, exactly as rendered (the template holds every special token they need)."""
    return [tokenizer.encode(prompt, add_special_tokens=False) for prompt in prompts]


def transformers_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    seed: int,
    max_new_tokens: int,
) -> list[str]:
    """Sampled completions. Prompts are batched by token length, so no padding enters the model."""
    stops = stop_ids(tokenizer)
    encoded = encode(tokenizer, prompts)
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, ids in enumerate(encoded):
        by_length[len(ids)].append(index)
    completions = [""] * len(prompts)
    device = next(model.parameters()).device
    with torch.no_grad():
        for indices in by_length.values():
            for start in range(0, len(indices), BATCH_SIZE):
                batch = indices[start : start + BATCH_SIZE]
                generators = [
                    torch.Generator(device=device).manual_seed(question_seed(seed, index)) for index in batch
                ]
                batch_ids = torch.tensor([encoded[index] for index in batch], dtype=torch.long, device=device)
                outputs = model(input_ids=batch_ids, use_cache=True, logits_to_keep=1)
                new: list[list[int]] = [[] for _ in batch]
                done = [False] * len(batch)
                for _ in range(max_new_tokens):
                    logits = outputs.logits[:, -1, :]
                    step = []
                    for row, generator in enumerate(generators):
                        token = None if done[row] else _top_p_sample(logits[row], generator)
                        done[row] = done[row] or token is None or token in stops
                        if not done[row] and token is not None:
                            new[row].append(token)
                        step.append(token if token is not None else min(stops))
                    if all(done):
                        break
                    next_ids = torch.tensor(step, dtype=torch.long, device=device)[:, None]
                    outputs = model(
                        input_ids=next_ids, past_key_values=outputs.past_key_values, use_cache=True
                    )
                for row, index in enumerate(batch):
                    completions[index] = cut_at_stop(
                        str(tokenizer.decode(new[row], skip_special_tokens=False))
                    )
    return completions


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def vllm_completions_by_seed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    seeds: int,
    max_new_tokens: int,
) -> list[list[str]]:
    """The same sampling through vLLM (a GPU only), one engine for every seed: per-request seeds, the
    same prompt tokens and stop tokens as the transformers loop. vLLM loads a directory, so the strictly
    loaded model is saved to scratch first: the checkpoint's own files never reach it."""
    from vllm import LLM, SamplingParams

    stops = sorted(stop_ids(tokenizer))
    requests = [{"prompt_token_ids": ids} for ids in encode(tokenizer, prompts)]
    with tempfile.TemporaryDirectory(prefix="gsm8k-model-") as model_dir:
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        engine = LLM(model=model_dir, dtype="bfloat16", seed=0)
        by_seed = []
        for seed in range(seeds):
            params = [
                SamplingParams(
                    temperature=TEMPERATURE,
                    top_p=TOP_P,
                    max_tokens=max_new_tokens,
                    seed=question_seed(seed, index),
                    stop=list(STOP),
                    stop_token_ids=stops,
                )
                for index in range(len(prompts))
            ]
            outputs = engine.generate(requests, params)
            by_seed.append([cut_at_stop(output.outputs[0].text) for output in outputs])
    return by_seed


def ignored_files(checkpoint: Path) -> list[str]:
    """What the checkpoint holds besides weights (a config, a tokenizer, a chat template): never read."""
    root = checkpoint_root(checkpoint)
    names = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not (path.parent == root and path.name.endswith(".safetensors"))
    )
    return names[:MAX_IGNORED_NAMES] + (
        [f"and {len(names) - MAX_IGNORED_NAMES} more"] if len(names) > MAX_IGNORED_NAMES else []
    )


def grade(task: Task, inputs: GraderInputs) -> GraderResult:
    torch.set_num_threads(TORCH_THREADS)
    if inputs.base_model is None:
        raise RuntimeError(f"task {task.name} needs its base model as a grader input")
    records = read_jsonl(inputs.split / DATASET_FILE)
    is_dev = inputs.purpose == "devEval"
    if is_dev and len(records) > DEV_QUESTIONS:  # run by hand: the platform samples dev itself
        records = random.Random(DEV_SAMPLE_SEED).sample(records, DEV_QUESTIONS)
    try:
        model, tokenizer = load_strict(inputs.base_model, inputs.checkpoint)
    except InvalidCheckpoint as exc:
        return GraderResult.invalid_checkpoint(str(exc), GRADER_VERSION)
    prompts = [render(str(record["question"])) for record in records]
    references = [str(record["answer"]) for record in records]
    seeds = 1 if is_dev else SEEDS
    use_vllm = vllm_available()
    if use_vllm:
        completions_by_seed = vllm_completions_by_seed(
            model, tokenizer, prompts, seeds=seeds, max_new_tokens=MAX_NEW_TOKENS
        )
    else:
        if torch.cuda.is_available():
            torch.nn.Module.to(model, device="cuda", dtype=torch.bfloat16)  # in place
        completions_by_seed = [
            transformers_completions(model, tokenizer, prompts, seed=seed, max_new_tokens=MAX_NEW_TOKENS)
            for seed in range(seeds)
        ]
    strict_by_seed: list[list[bool]] = []
    flexible_by_seed: list[list[bool]] = []
    for completions in completions_by_seed:
        graded = [grade_completion(c, r) for c, r in zip(completions, references, strict=True)]
        strict_by_seed.append([g.strict for g in graded])
        flexible_by_seed.append([g.flexible for g in graded])
    strict = seed_mean_with_interval(strict_by_seed)
    ignored = ignored_files(inputs.checkpoint)
    reason = None
    if ignored:
        reason = (
            "scored with the task's chat template and the base model's config and tokenizer; the "
            f"checkpoint's other files were not read: {', '.join(ignored)}"
        )
    flexible = seed_mean_with_interval(flexible_by_seed)
    return GraderResult(
        score=strict.mean,
        n=len(records),
        status="ok",
        reason=reason,
        interval=(strict.low, strict.high),
        details={
            "seeds": seeds,
            "per_seed": list(strict.per_seed),
            "flexible_extract": flexible.mean,
            "generator": "vllm" if use_vllm else "transformers",
            "ignored_files": ignored,
        },
        grader_version=GRADER_VERSION,
    )
