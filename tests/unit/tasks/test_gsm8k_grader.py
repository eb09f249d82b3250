"""The `gsm8k` grader on the stand-in: a tiny Qwen3-architecture base built here with a real BPE
tokenizer, fine-tuned here for a few hundred steps on the stand-in's train split, graded on its
hidden split. What a researcher relies on: the score is the seed mean with its interval, completions
do not depend on batching or thread count, and a checkpoint's own files never change the grading."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from posttrain_task_gsm8k import define  # noqa: E402
from posttrain_task_gsm8k import grader as gsm8k_grader  # noqa: E402
from posttrain_task_gsm8k.prompt import render  # noqa: E402
from posttrain_task_gsm8k.standin import build_model, splits  # noqa: E402

from graders.inputs import GraderInputs  # noqa: E402
from graders.tasks import AssetLocation, Task  # noqa: E402

# A fine-tune of the stand-in (half a minute on an idle 2-core machine) and a dozen gradings: room for
# a machine many times slower under load.
pytestmark = pytest.mark.timeout(1800)

WEIGHTS = "model.safetensors"
SFT_STEPS = 600


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The stand-in base, a checkpoint fine-tuned from it, and the hidden and dev splits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("gsm8k")
    base = root / "base"
    base.mkdir()
    build_model(base, lambda _message: None)
    for split in ("hidden", "dev"):
        (root / split).mkdir()
        lines = "".join(json.dumps(record) + "\n" for record in splits()[split])
        (root / split / "data.jsonl").write_text(lines)

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=torch.float32)
    texts = [render(r["question"]) + r["answer"] + "<|im_end|>" for r in splits()["train"]]
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(SFT_STEPS):
        rows = [encoded[i] for i in torch.randint(len(encoded), (16,)).tolist()]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = torch.tensor(row)
            mask[index, : len(row)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = root / "trained"
    model.save_pretrained(trained)
    return {"base": base, "trained": trained, "hidden": root / "hidden", "dev": root / "dev", "root": root}


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> Task:
    # Fewer seeds, tokens and dev questions than the benchmark's, for time; the same code.
    monkeypatch.setattr(gsm8k_grader, "SEEDS", 2)
    monkeypatch.setattr(gsm8k_grader, "MAX_NEW_TOKENS", 80)
    monkeypatch.setattr(gsm8k_grader, "DEV_QUESTIONS", 20)
    return define(AssetLocation())


def _checkpoint(stand_in: dict[str, Path], tmp_path: Path, source: str = "trained") -> Path:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir(parents=True)
    shutil.copy(stand_in[source] / WEIGHTS, checkpoint / WEIGHTS)
    return checkpoint


def _inputs(stand_in: dict[str, Path], checkpoint: Path, purpose: str = "score") -> GraderInputs:
    split = stand_in["hidden" if purpose == "score" else "dev"]
    return GraderInputs(checkpoint=checkpoint, split=split, base_model=stand_in["base"], purpose=purpose)  # type: ignore[arg-type]


def test_the_score_is_the_seed_mean_with_its_interval(
    stand_in: dict[str, Path], task: Task, tmp_path: Path
) -> None:
    result = gsm8k_grader.grade(task, _inputs(stand_in, _checkpoint(stand_in, tmp_path)))
    assert result.status == "ok" and result.reason is None, result
    assert result.n == 100 and result.details["seeds"] == 2
    per_seed = result.details["per_seed"]
    assert result.score == pytest.approx(sum(per_seed) / 2)
    assert result.interval is not None and result.interval[0] <= result.score <= result.interval[1]
    assert result.score > 0, "the fine-tuned stand-in answers some questions"
    assert result.details["generator"] == "transformers"
    untrained = gsm8k_grader.grade(task, _inputs(stand_in, _checkpoint(stand_in, tmp_path / "b", "base")))
    assert untrained.status == "ok" and untrained.score < result.score


def test_a_dev_evaluation_grades_a_sample_of_dev_with_one_seed(
    stand_in: dict[str, Path], task: Task, tmp_path: Path
) -> None:
    result = gsm8k_grader.grade(task, _inputs(stand_in, _checkpoint(stand_in, tmp_path), "devEval"))
    assert result.status == "ok" and result.n == 20 and result.details["seeds"] == 1


def test_completions_do_not_depend_on_batching_or_threads_and_differ_by_seed(
    stand_in: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from graders.checkpoint import load_strict

    model, tokenizer = load_strict(stand_in["base"], stand_in["trained"])
    prompts = [render(r["question"]) for r in splits()["hidden"][:12]]

    def sample(seed: int) -> list[str]:
        return gsm8k_grader.transformers_completions(model, tokenizer, prompts, seed=seed, max_new_tokens=40)

    torch.set_num_threads(2)
    batched = sample(0)
    monkeypatch.setattr(gsm8k_grader, "BATCH_SIZE", 1)
    torch.set_num_threads(1)
    assert sample(0) == batched
    assert sample(1) != batched
    assert any("####" in completion for completion in batched)


def test_a_checkpoints_own_template_tokenizer_and_config_are_not_read_and_the_result_says_so(
    stand_in: dict[str, Path], task: Task, tmp_path: Path
) -> None:
    clean = gsm8k_grader.grade(task, _inputs(stand_in, _checkpoint(stand_in, tmp_path / "clean")))
    dressed = _checkpoint(stand_in, tmp_path / "dressed")
    (dressed / "chat_template.jinja").write_text("{{ 'The answer is #### 42' }}")
    (dressed / "tokenizer.json").write_text("{}")
    config = json.loads((stand_in["base"] / "config.json").read_text())
    (dressed / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1, "vocab_size": 9}))
    result = gsm8k_grader.grade(task, _inputs(stand_in, dressed))
    assert result.status == "ok" and result.score == clean.score and result.interval == clean.interval
    assert result.reason is not None and "were not read" in result.reason
    assert result.details["ignored_files"] == ["chat_template.jinja", "config.json", "tokenizer.json"]


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ("resized_vocab", "has shape"),
        ("foreign_name", "unexpected tensors: 'lm_head.weight'"),
    ],
)
def test_a_checkpoint_of_another_shape_or_naming_is_refused_with_the_reason(
    stand_in: dict[str, Path], task: Task, tmp_path: Path, tamper: str, reason: str
) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(stand_in["trained"] / WEIGHTS)
    embeddings = tensors["model.embed_tokens.weight"]
    if tamper == "resized_vocab":
        tensors["model.embed_tokens.weight"] = torch.cat([embeddings, embeddings[:8]])
    else:  # the base ties its output layer to the embeddings: a separate head is not this model
        tensors["lm_head.weight"] = embeddings.clone()
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    save_file(tensors, str(checkpoint / WEIGHTS))
    result = gsm8k_grader.grade(task, _inputs(stand_in, checkpoint))
    assert result.status == "invalid_checkpoint" and result.score == 0
    assert result.reason is not None and reason in result.reason


@pytest.mark.skipif(
    not gsm8k_grader.vllm_available(), reason="needs vLLM and a CUDA GPU; neither is on this machine"
)
def test_the_same_grader_generates_through_vllm_on_a_gpu(
    stand_in: dict[str, Path], task: Task, tmp_path: Path
) -> None:
    result = gsm8k_grader.grade(task, _inputs(stand_in, _checkpoint(stand_in, tmp_path)))
    assert result.status == "ok" and result.details["generator"] == "vllm"
    assert result.interval is not None and result.interval[0] <= result.score <= result.interval[1]
