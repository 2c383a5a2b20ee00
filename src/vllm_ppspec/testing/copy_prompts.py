"""Copy-heavy chat prompts for the real model (demo, e2e test, benchmark).

Each asks SmolLM2 to repeat, rewrite or edit a paragraph or some code, so the
answer copies long runs of the prompt: what prompt-lookup (ngram) drafting
predicts. Two plain questions keep a request that copies nothing in the mix.
"""

from __future__ import annotations

from typing import Any

PARAGRAPH = (
    "The river rose slowly through the night, and by morning the low fields near the "
    "mill were under water. The miller moved his sacks of flour to the upper floor, "
    "tied the boat to the door, and waited for the rain to stop."
)
CODE = "def area(width, height):\n    return width * height\n\nprint(area(3, 4))\n"
PROMPTS = [
    f"Repeat this paragraph exactly:\n\n{PARAGRAPH}",
    f"Rewrite this paragraph in the present tense:\n\n{PARAGRAPH}",
    f"Copy this code and rename the function to rectangle_area:\n\n{CODE}",
    f"Repeat this code exactly, then explain it in one sentence:\n\n{CODE}",
    "List the days of the week, one per line, twice.",
    "What is the capital of France? Answer in one sentence.",
]
MAX_TOKENS = [64, 60, 56, 72, 48, 20]
# ngram settings for natural text: a match of 2-5 tokens proposes the next k.
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}


def chat_token_ids(model_path: str, prompts: list[str] = PROMPTS) -> list[list[int]]:
    """Each prompt as one user turn through the model's chat template, as token ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    out = []
    for p in prompts:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert isinstance(ids, list), type(ids)  # tokenize=True, return_dict=False
        out.append([int(t) for t in ids])  # type: ignore[arg-type]
    return out


def requests(model_path: str, n: int | None = None, max_tokens: int | None = None) -> list[Any]:
    """``n`` offline-job requests cycling through the prompts (all of them by default)."""
    ids = chat_token_ids(model_path)
    n = len(ids) if n is None else n
    return [
        {
            "prompt_token_ids": ids[i % len(ids)],
            "max_tokens": max_tokens or MAX_TOKENS[i % len(ids)],
        }
        for i in range(n)
    ]
