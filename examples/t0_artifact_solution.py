"""A correct t0_artifact job: sum each key's values from the records dataset into answer.json."""

import collections
import json
import os

sums: collections.Counter[str] = collections.Counter()
with open(os.path.join(os.environ["POSTTRAIN_INPUT_RECORDS"], "data.jsonl")) as records:
    for line in records:
        record = json.loads(line)
        sums[record["key"]] += record["value"]
with open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "answer.json"), "w") as answer:
    json.dump(dict(sums), answer)
print("wrote", len(sums), "keys")
