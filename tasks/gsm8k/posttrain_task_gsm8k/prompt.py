"""What the model is asked, fixed by the task: never the checkpoint's own chat template, which an agent
could change to leak or reshape the prompt.

Zero-shot, in ChatML (the base models' own format: Qwen3, SmolLM3), asking for the answer in the
`#### <number>` form that the strict-match extraction reads. `CHAT_TEMPLATE` is the same format as a
Jinja template, for tokenizers and for vLLM; `render` is what the grader feeds the model.
"""

from __future__ import annotations

INSTRUCTION = (
    "Solve this grade-school math problem. Reason step by step, then give the final answer on a line "
    "of its own as '#### <number>'."
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Generation ends at the end of the assistant's turn, or where a model starts a new question.
STOP = ("<|im_end|>", "\n\nQuestion:")
# How answers are sampled (the grader's, and what the task tells the agent).
TEMPERATURE = 0.6
TOP_P = 0.95


def user_message(question: str) -> str:
    return f"{INSTRUCTION}\n\nQuestion: {question.strip()}"


def render(question: str) -> str:
    """The prompt as `CHAT_TEMPLATE` renders one user turn with the generation prompt."""
    return f"<|im_start|>user\n{user_message(question)}<|im_end|>\n<|im_start|>assistant\n"


def cut_at_stop(completion: str) -> str:
    """The completion up to the first stop sequence (a generator may run past it within a batch)."""
    ends = [index for index in (completion.find(stop) for stop in STOP) if index >= 0]
    return completion[: min(ends)] if ends else completion
