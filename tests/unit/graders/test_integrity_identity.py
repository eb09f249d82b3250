"""Model identity on tiny Llama models trained here: a fine-tune descends from its base; another seed,
a re-initialised model or a half-transplanted one does not; the base saved again is unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from graders.integrity.identity import IdentityReport, compare

VOCAB = 64
LAYERS = 4
WEIGHTS = "model.safetensors"
THRESHOLDS = {"min_cosine": 0.1, "min_kept_share": 0.5, "min_relative_change": 1e-6}  # the recommended
Tensors = dict[str, torch.Tensor]


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def train(model: LlamaForCausalLM, *, steps: int, lr: float, seed: int, shift: int) -> Tensors:
    """Adam on a toy language: every odd token is the previous one plus `shift`."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (8, 16), generator=generator)
        ids[:, 1::2] = (ids[:, 0::2] + shift) % VOCAB
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base pre-trained the way a task's is: seeded init, then training."""
    model = tiny_model(seed=0)
    train(model, steps=150, lr=1e-3, seed=0, shift=1)
    directory = tmp_path_factory.mktemp("base")
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def base(base_dir: Path) -> Tensors:
    return load_file(base_dir / WEIGHTS)


@pytest.fixture(scope="module")
def other_seed(base: Tensors) -> Tensors:
    """The same architecture pre-trained the same way from another seed."""
    model = tiny_model(seed=1)
    trained = train(model, steps=150, lr=1e-3, seed=1, shift=1)
    return {name: trained[name] for name in base}


def check(base_dir: Path, checkpoint: Tensors, **overrides: float) -> IdentityReport:
    return compare(base_dir, checkpoint, **{**THRESHOLDS, **overrides})


def test_a_fine_tune_descends_from_its_base(base_dir: Path, base: Tensors) -> None:
    model = tiny_model(seed=5)
    model.load_state_dict(base)
    tuned = train(model, steps=300, lr=3e-4, seed=7, shift=3)
    report = check(base_dir, {name: tuned[name] for name in base})
    assert report.verdict == "descendant", report.summary()
    assert report.kept_share == 1.0
    assert 0.01 < report.relative_change < 1.0
    assert report.lowest_cosine > 0.5
    assert report.unchanged_tensors == 0
    assert report.summary().endswith("descends from the base")


def test_a_hard_fine_tune_of_an_untrained_base_is_a_descendant(tmp_path: Path) -> None:
    """As the gsm8k stand-in's SFT: a high rate from a random init takes cosines far below 0.5."""
    untrained = tiny_model(seed=0)
    base = {name: tensor.clone() for name, tensor in untrained.state_dict().items()}
    tuned = train(untrained, steps=300, lr=3e-3, seed=7, shift=3)
    save_file(base, tmp_path / WEIGHTS)
    report = check(tmp_path, tuned)
    assert report.median_cosine < 0.5
    assert report.verdict == "descendant", report.summary()
    assert check(tmp_path, tuned, min_cosine=0.5).verdict == "foreign"


def test_small_noise_is_a_descendant(base_dir: Path, base: Tensors) -> None:
    torch.manual_seed(3)
    noisy = {name: t + 0.05 * float(t.std()) * torch.randn_like(t) for name, t in base.items()}
    report = check(base_dir, noisy)
    assert report.verdict == "descendant"
    assert report.median_cosine > 0.99


def test_another_seed_trained_the_same_way_is_foreign(base_dir: Path, other_seed: Tensors) -> None:
    report = check(base_dir, other_seed)
    assert report.verdict == "foreign", report.summary()
    assert report.kept_share == 0.0
    assert abs(report.median_cosine) < 0.1
    assert report.summary().endswith("not a descendant of the base")
    assert report.figures()["verdict"] == "foreign"


def test_a_reinitialised_model_is_foreign(base_dir: Path, base: Tensors) -> None:
    fresh = tiny_model(seed=2).state_dict()
    report = check(base_dir, {name: fresh[name] for name in base})
    assert report.verdict == "foreign"
    # Its norms (all ones) may equal an untrained base's: only matrices decide, and none is kept.
    assert report.kept_share == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_base_saved_again_is_unchanged(base_dir: Path, base: Tensors, dtype: torch.dtype) -> None:
    report = check(base_dir, {name: tensor.to(dtype) for name, tensor in base.items()})
    assert report.verdict == "unchanged"
    assert report.unchanged_tensors == report.tensors == len(base)
    if dtype != torch.float32:  # rounding moves it by far more than min_relative_change: equality decides
        assert report.relative_change > 1e-5
    assert "the base model unchanged" in report.summary()


def test_a_change_below_min_relative_change_is_unchanged(base_dir: Path, base: Tensors) -> None:
    nudged = {name: tensor.clone() for name, tensor in base.items()}
    nudged["model.layers.0.mlp.up_proj.weight"][0, 0] += 1e-6
    report = check(base_dir, nudged)
    assert report.unchanged_tensors == len(base) - 1
    assert report.verdict == "unchanged"
    assert check(base_dir, nudged, min_relative_change=0.0).verdict == "descendant"


def test_half_the_layers_transplanted_keeps_about_half(
    base_dir: Path, base: Tensors, other_seed: Tensors
) -> None:
    transplanted = [f"model.layers.{layer}." for layer in range(LAYERS // 2)]
    mixed = {
        name: other_seed[name] if name.startswith(tuple(transplanted)) else tensor
        for name, tensor in base.items()
    }
    matrices = {name: t.numel() for name, t in base.items() if t.ndim >= 2}
    foreign = sum(n for name, n in matrices.items() if name.startswith(tuple(transplanted)))
    expected = 1 - foreign / sum(matrices.values())  # embeddings and the head stay the base's
    report = check(base_dir, mixed)
    assert report.kept_share == pytest.approx(expected)
    assert 0.4 < report.kept_share < 0.6
    assert report.verdict == ("descendant" if expected >= 0.5 else "foreign")
    assert check(base_dir, mixed, min_kept_share=0.7).verdict == "foreign"
    assert all(name.startswith(tuple(transplanted)) for name, _ in report.lowest)
    assert len(report.lowest) == 3


def test_zero_tensors_and_plain_files(tmp_path: Path) -> None:
    """No NaN from zero norms: a zero bias that stays zero is kept, one that moves is a change."""
    torch.manual_seed(0)
    weights = {"w": torch.randn(8, 8), "bias": torch.zeros(8), "scale": torch.ones(8)}
    save_file(weights, tmp_path / WEIGHTS)
    same_zero = check(tmp_path, {**weights, "w": weights["w"] * 1.01})
    assert same_zero.verdict == "descendant"
    moved = check(tmp_path, {**weights, "bias": torch.ones(8)})
    assert moved.verdict == "descendant"  # matrices kept; the moved bias shows in relative_change
    assert moved.relative_change == pytest.approx(math.sqrt(8 / (float(weights["w"].square().sum()) + 8)))
    zeroed = check(tmp_path, {**weights, "w": torch.zeros(8, 8)})
    assert zeroed.verdict == "foreign"
    assert zeroed.lowest_cosine == 0.0
    figures = zeroed.figures()
    assert all(isinstance(value, int | float | str) for value in figures.values())
    assert not any(isinstance(value, float) and math.isnan(value) for value in figures.values())


def test_huge_weights_cannot_pass_for_kept(base_dir: Path, base: Tensors, other_seed: Tensors) -> None:
    """Unused embedding rows can hold anything: in float32 the norms overflow and the figures with them."""
    huge = {name: tensor.clone() for name, tensor in other_seed.items()}
    for tensor in huge.values():
        tensor.view(-1)[0] = 3e38
    report = check(base_dir, huge)
    assert report.verdict == "foreign"
    assert report.kept_share == 0.0
    assert all(math.isfinite(value) for value in report.figures().values() if isinstance(value, float))


def test_a_base_without_weights_is_the_platforms_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no safetensors weights"):
        check(tmp_path, {})
