"""A tiny untrained base model of the arithmetic task's architecture, shared by the checkpoint tests.

Torch is imported inside the fixtures, so the torch-free grader tests here stay torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Loading rules do not depend on training, so an untrained base will do."""
    import torch
    from transformers import LlamaForCausalLM

    from graders.assets.tiny_model import build_config, build_tokenizer

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("base")
    tokenizer = build_tokenizer()
    LlamaForCausalLM(build_config(tokenizer, hidden=16, layers=1)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def base_tensors(base_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(base_dir / WEIGHTS)
