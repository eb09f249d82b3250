"""A few steps of trl's SFTTrainer on the task's base model and training split (the trl environment)."""

import json
import os

import datasets
import peft
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir = os.environ["POSTTRAIN_INPUT_MODEL"]
print("versions", trl.__version__, peft.__version__, datasets.__version__, flush=True)
train = datasets.load_dataset(
    "json", data_files=os.path.join(os.environ["POSTTRAIN_INPUT_TRAIN"], "data.jsonl"), split="train"
)
config = trl.SFTConfig(
    output_dir=os.path.join(os.environ["TMPDIR"], "sft"),
    max_steps=5,
    per_device_train_batch_size=8,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    max_length=32,
)
trainer = trl.SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir),
    args=config,
    train_dataset=train,
    processing_class=AutoTokenizer.from_pretrained(model_dir),
)
result = trainer.train()
print("sft", json.dumps({"steps": result.global_step, "loss": round(result.training_loss, 4)}), flush=True)
trainer.save_model(os.environ["POSTTRAIN_OUTPUT_DIR"])
