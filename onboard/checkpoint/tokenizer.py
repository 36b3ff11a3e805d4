"""A small byte-level BPE tokenizer, trained offline on a bundled English text.

Byte-level BPE (GPT-2 style) encodes any text without unknown tokens, so every
prompt works; training on the bundled text makes common English words single
tokens. ``<|bos|>`` is prepended to every encoding (like Llama's tokenizers) and
``<|eos|>`` ends generation. Files written: ``tokenizer.json`` and
``tokenizer_config.json``, loadable by ``AutoTokenizer.from_pretrained`` and vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

# A simple chat template so chat-style prompts work too.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

# Original prose written for this package (no third-party text).
CORPUS = """\
The model reads a prompt, one token at a time, and predicts the next token. A token
is a short piece of text: a word, a part of a word, a space or a sign. When the
prediction is good, the text it writes is clear and useful. When it is poor, the
text wanders, repeats itself, or stops too early.

Every morning the harbour town wakes slowly. The fishing boats come back before
the sun is high, the market opens, and the bakers carry warm bread to the cafes on
the square. Children run to school along the old stone wall. By noon the streets are
quiet again, and only the gulls and the wind are busy.

Engineers who bring a new model to a serving engine check many small things. The
names of the weights must match the code that loads them. The number of heads, the
size of each head and the length of the context must agree with the kernels that
run on the hardware. A router must choose the same experts in the reference code
and in the engine, or the answers drift apart after a few tokens.

Weather report for the week: Monday will be cloudy with light rain in the north.
Tuesday and Wednesday should be dry and bright, with a gentle breeze from the west.
On Thursday a band of heavy rain moves in from the sea, and Friday stays cool and
grey. The weekend looks warm and sunny across the whole country.

To bake a simple loaf, mix flour, water, salt and yeast in a large bowl. Knead the
dough for ten minutes until it is smooth, then leave it to rise for an hour in a
warm place. Shape it, let it rise again, and bake it in a hot oven for about forty
minutes. The bread is ready when it sounds hollow as you tap the bottom.

Numbers appear in text all the time: one, two, three, four, five, six, seven,
eight, nine and ten; 0 1 2 3 4 5 6 7 8 9; 12, 64, 100, 256, 1024 and 2048. Dates,
prices and times follow their own patterns, such as 10:30, 3.5 percent, or the year
2026.

The library stands at the end of the long road by the river. Inside, the shelves
hold books about history, science, music and art. Students sit at the wooden tables
and write notes, while the librarian answers questions and finds lost books. In the
evening the lights stay on late, and the reading room is calm and warm.

A good test is small, fast and clear. It checks one thing, it fails when that thing
is wrong, and its message says what went wrong and where. Tests that start a whole
engine are slower, so they share one engine and ask it many questions at once.

Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many days are there in a week? Answer: There are seven days in a week.
Question: What colour is the sky on a clear day? Answer: The sky is blue.
Hello, my name is Sam. I live in a small house near the park with my family and our
old dog. We like to walk in the hills, read stories, and cook dinner together.
"""


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Train the byte-level BPE on the bundled corpus (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() > vocab_size:  # the trainer never exceeds it; be sure
        raise AssertionError("tokenizer outgrew the vocabulary")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID)],
    )
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``out_dir``."""
    tok = build_tokenizer(vocab_size)
    for token, want in zip(SPECIAL_TOKENS, (PAD_ID, BOS_ID, EOS_ID), strict=True):
        if tok.token_to_id(token) != want:
            raise AssertionError(f"{token} is not id {want}")
    (out_dir / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2) + "\n", encoding="utf-8"
    )
