"""Job scripts of a checkpoint chain, as the emulator and kind pods run them: the first writes a
checkpoint of real size, the second resumes from it through inputsFrom."""

# 5 GiB of optimizer state in two shards, one of 3 GiB, written for real (dense).
OPTIMIZER_STATE = """
import os
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
chunk = b"\\x5a" * (64 << 20)
for shard, gib in (("00001", 3), ("00002", 2)):
    with open(os.path.join(out, f"optimizer-state-{shard}-of-00002.raw"), "wb") as f:
        for _ in range(gib * 16):
            f.write(chunk)
print("wrote", sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out)), flush=True)
"""
# A checkpoint as a real run leaves one: the model's files and that state, each file under the
# task's 8 GiB file cap.
BIG_CHECKPOINT = (
    """
import os, shutil
out, model = os.environ["POSTTRAIN_OUTPUT_DIR"], os.environ["POSTTRAIN_INPUT_MODEL"]
for name in os.listdir(model):
    shutil.copy(os.path.join(model, name), out)
"""
    + OPTIMIZER_STATE
)
# Resumes from it: reads its state back (the 3 GiB shard to its last byte) and writes a changed model.
RESUMED = """
import os
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
source = os.environ["POSTTRAIN_INPUT_FROM_0"]
shard = os.path.join(source, "optimizer-state-00001-of-00002.raw")
with open(shard, "rb") as f:
    f.seek(-1, os.SEEK_END)
    assert os.path.getsize(shard) == 3 << 30 and f.read() == b"\\x5a"
model = AutoModelForCausalLM.from_pretrained(source)
with torch.no_grad():
    model.lm_head.weight.mul_(1.0001)
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
model.save_pretrained(out)
AutoTokenizer.from_pretrained(source).save_pretrained(out)
print("resumed from", os.path.basename(source), "read-only:", not os.access(source, os.W_OK), flush=True)
"""
