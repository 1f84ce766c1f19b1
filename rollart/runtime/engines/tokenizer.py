"""A byte-level BPE tokenizer built offline for the random-init CPU model.

Nothing is downloaded: :func:`build_tokenizer` trains a byte-level BPE with ``tokenizers`` on a
small corpus generated here (:func:`training_corpus`: FrozenLake boards and moves, number
guessing, arithmetic with answers, Python snippets, all wrapped in chat turns), pads the
vocabulary with reserved special tokens up to exactly the model's vocabulary size, and wraps
it in ``transformers.PreTrainedTokenizerFast``.

* Deterministic: the corpus comes from a fixed seed and BPE training is deterministic, so the
  same ``vocab_size`` always gives the same ids (a test checks two builds are identical).
* Byte-level: every string round-trips, ``decode(encode(s)) == s``, unknown characters included.
* Special tokens (ids 0, 1, 2): ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos,
  the end of a chat turn). The chat format is ChatML, as Qwen uses; :func:`render_chat` renders
  it in plain Python and the tokenizer carries the same format as a ``chat_template``.
* ``cache_dir``: the tokenizer is saved there (``save_pretrained``) under a folder named by the
  vocabulary size and a hash of the corpus, and later builds load it (offline) instead of
  training again.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
RESERVED_FORMAT = "<|reserved_{}|>"
CORPUS_VERSION = 1  # bump when the corpus generator changes (changes the cache key)

# A Jinja rendering of exactly what render_chat produces (transformers' apply_chat_template).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chat(messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then (by default)
    ``<|im_start|>assistant\\n`` so the model continues as the assistant."""
    parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


# ---------------------------------------------------------------- the training corpus

_SYSTEM = "You are an agent. Think briefly, then answer."


def _frozenlake(rng: random.Random) -> list[dict[str, str]]:
    size = rng.choice((4, 4, 4, 8))
    grid = [["F"] * size for _ in range(size)]
    for _ in range(size * size // 5):
        grid[rng.randrange(size)][rng.randrange(size)] = "H"
    grid[0][0], grid[-1][-1] = "S", "G"
    r, c = rng.randrange(size), rng.randrange(size)
    board = "\n".join("".join("P" if (i, j) == (r, c) else ch for j, ch in enumerate(row))
                      for i, row in enumerate(grid))
    move = rng.choice(("LEFT", "DOWN", "RIGHT", "UP"))
    user = (f"You are on a frozen lake. Reach the goal G without falling into a hole H.\n{board}\n"
            f"You are at row {r}, column {c}. Answer with one of LEFT, DOWN, RIGHT, UP.")
    answer = rng.choice((f"{move}", f"I will move {move}.", f"The goal is down and right, so {move}.",
                         f"<think>A hole is near; go {move.lower()}.</think> {move}"))
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def _guess(rng: random.Random) -> list[dict[str, str]]:
    lo, hi = 1, rng.choice((20, 50, 100))
    secret, turns = rng.randint(lo, hi), []
    turns.append({"role": "user", "content": f"I picked a number between {lo} and {hi}. "
                                             "Guess it; answer as \\boxed{n}."})
    for _ in range(rng.randint(1, 4)):
        guess = (lo + hi) // 2
        turns.append({"role": "assistant", "content": f"My guess is \\boxed{{{guess}}}."})
        if guess == secret:
            turns.append({"role": "user", "content": f"Correct! The number was {secret}."})
            break
        if guess < secret:
            lo = guess + 1
            turns.append({"role": "user", "content": f"Your guess {guess} is too low. Try again."})
        else:
            hi = guess - 1
            turns.append({"role": "user", "content": f"Your guess {guess} is too high. Try again."})
    return turns


def _arithmetic(rng: random.Random) -> list[dict[str, str]]:
    a, b = rng.randint(0, 999), rng.randint(1, 99)
    op = rng.choice("+-*/")
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    sym = "//" if op == "/" else op
    question = rng.choice((f"What is {a} {op} {b}?", f"Compute {a}{op}{b}.",
                           f"Solve: x = {a} {op} {b}. Give the final answer in \\boxed{{}}."))
    answer = rng.choice((f"{a} {sym} {b} = {value}. The answer is \\boxed{{{value}}}.",
                         f"<think>{a} {op} {b} equals {value}</think>\n\\boxed{{{value}}}",
                         f"Answer: {value}"))
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


_SNIPPETS = (
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import math\n\nprint(math.sqrt(16))\n",
    "def is_prime(n: int) -> bool:\n    if n < 2:\n        return False\n"
    "    for i in range(2, int(n ** 0.5) + 1):\n        if n % i == 0:\n            return False\n    return True\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n",
    "with open('data.txt') as fh:\n    lines = [line.strip() for line in fh]\n",
    "def reverse(s: str) -> str:\n    return s[::-1]\n\nassert reverse('abc') == 'cba'\n",
    "result = sorted(values, key=lambda x: (-x[1], x[0]))\nprint(result)\n",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = None\n",
    "for i, row in enumerate(grid):\n    if 'G' in row:\n        print(i, row.index('G'))\n",
)


def _python(rng: random.Random) -> list[dict[str, str]]:
    code = rng.choice(_SNIPPETS)
    task = rng.choice(("Write a Python function for this task.", "Fix the bug in this code.",
                       "What does this program print?"))
    reply = rng.choice((f"```python\n{code}```", f"Here is the code:\n```python\n{code}```\nIt runs in O(n).",
                        f"The output is {rng.randint(0, 99)}.\n```python\n{code}```"))
    return [{"role": "user", "content": f"{task}\n```python\n{code}```"}, {"role": "assistant", "content": reply},
            {"role": "user", "content": rng.choice(("Tests passed: 3/3.", "Traceback (most recent call last):\n"
                                                    "  File \"main.py\", line 2\nNameError: name 'x' is not defined",
                                                    "Exit code 0. stdout: ok"))}]


def training_corpus(n_dialogues: int = 240, seed: int = 0) -> list[str]:
    """Chat-formatted dialogues of the shipped task kinds (deterministic for a seed)."""
    rng = random.Random(seed)
    makers = (_frozenlake, _guess, _arithmetic, _python)
    out = []
    for i in range(n_dialogues):
        turns = makers[i % len(makers)](rng)
        out.append(render_chat([{"role": "system", "content": _SYSTEM}, *turns], add_generation_prompt=False)
                   + ENDOFTEXT)
    return out


def _corpus_hash(corpus: list[str]) -> str:
    h = hashlib.sha256(f"v{CORPUS_VERSION}".encode())
    for text in corpus:
        h.update(text.encode())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------- building


def _train(vocab_size: int, corpus: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:  # the corpus ran out of merges: fill the table with reserved special tokens
        tok.add_special_tokens([RESERVED_FORMAT.format(i) for i in range(missing)])
    return tok


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token=IM_END, pad_token=ENDOFTEXT,
                                 unk_token=None, clean_up_tokenization_spaces=False,
                                 model_input_names=["input_ids", "attention_mask"])
    hf.chat_template = CHAT_TEMPLATE
    return hf


def min_vocab_size() -> int:
    """256 byte symbols plus the special tokens."""
    return 256 + len(SPECIAL_TOKENS)


def build_tokenizer(vocab_size: int, cache_dir: Optional[str | Path] = None) -> Any:
    """A ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` ids (``len(tok) == vocab_size``).

    With ``cache_dir``, a tokenizer saved there by an earlier build with the same size and
    corpus is loaded instead of trained (and a new one is saved there)."""
    vocab_size = int(vocab_size)
    if vocab_size < min_vocab_size():
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE: "
                         f"need at least {min_vocab_size()} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    corpus = training_corpus()
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"rollart-bpe-{vocab_size}-{_corpus_hash(corpus)}"
        if (path / "tokenizer.json").exists():
            return load_tokenizer(path)
    hf = _wrap(_train(vocab_size, corpus))
    if len(hf) != vocab_size:  # pragma: no cover - a tokenizers change
        raise RuntimeError(f"built a tokenizer of {len(hf)} ids, expected {vocab_size}")
    if path is not None:
        save_tokenizer(hf, path)
    return hf


def save_tokenizer(tokenizer: Any, path: str | Path) -> Path:
    """``save_pretrained`` into ``path`` (written to a temporary folder, then renamed, so a
    concurrent reader never sees half a tokenizer)."""
    import os
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=path.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, path)
        except OSError:  # another process saved it first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_tokenizer(path: str | Path) -> Any:
    """Load a tokenizer saved by :func:`save_tokenizer` (offline)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    if not getattr(hf, "chat_template", None):
        hf.chat_template = CHAT_TEMPLATE
    return hf


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end a generation: ``<|im_end|>`` and ``<|endoftext|>`` (those the tokenizer has)."""
    ids = []
    for tok in (IM_END, ENDOFTEXT):
        i = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(i, int) and i >= 0 and i != getattr(tokenizer, "unk_token_id", None):
            ids.append(i)
    return ids


__all__ = ["CHAT_TEMPLATE", "ENDOFTEXT", "IM_END", "IM_START", "SPECIAL_TOKENS", "build_tokenizer",
           "load_tokenizer", "min_vocab_size", "render_chat", "save_tokenizer", "stop_token_ids",
           "training_corpus"]
