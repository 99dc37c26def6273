"""A tiny Qwen3-shaped tokenizer and model, built in-process in seconds: no hub, no downloads.

The tokenizer is a byte-level BPE trained on a few lines of text, with Qwen3's special tokens and a
ChatML chat template in Qwen3's style (tools in the system turn, ``<tool_call>`` in assistant turns,
tool results as ``<tool_response>`` inside a user turn). Every code path that needs "the tokenizer at
``args.hf_checkpoint``" can point at :func:`save_tiny_checkpoint`'s directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from aclarena_slime.recipes.local_section import LocalBackendSettings

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special, as in Qwen3: they survive ``skip_special_tokens`` when decoding.
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# A ChatML template in Qwen3's layout, written for this project.
CHAT_TEMPLATE = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + (fn.arguments if fn.arguments is string else (fn.arguments | tojson)) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
""".strip()

_TRAINING_TEXT = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "The answer is \\boxed{42}. So the answer is 073 and 73 and 1234567890.",
    "<search> capital of France </search> <information> Doc 1(Title: Paris) Paris is the capital. </information>",
    "<answer> Paris </answer> <think> Let me think about this. </think>",
    '{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}',
    "Write your whole response in lowercase letters, without any commas, in exactly three paragraphs.",
    "The quick brown fox jumps over the lazy dog. Hello, world! What is 2 + 2 = 4?",
    "user assistant system tool function tools query return json object arguments name",
]


@dataclass(frozen=True)
class TinyShape:
    """The tiny model's size: BPE vocabulary (before the special tokens), width, layers."""

    # the recipe's defaults (cluster.local.tiny_*), for a tiny model built outside a stage (tests, benchmarks)
    vocab_size: int = LocalBackendSettings.tiny_vocab_size
    hidden_size: int = LocalBackendSettings.tiny_hidden_size
    num_layers: int = LocalBackendSettings.tiny_layers

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"tiny model {name} must be a positive integer, got {value!r}")
        if self.hidden_size % 4:
            raise ValueError(f"tiny model hidden_size must be a multiple of 4 (4 heads), got {self.hidden_size}")


def build_tiny_tokenizer(vocab_size: int = 512, texts: Sequence[str] = ()):
    """A ``PreTrainedTokenizerFast`` with Qwen3's special tokens and chat template.

    ``texts`` join the built-in lines as BPE training text: a tokenizer trained on text like what the
    model will read splits it into fewer, more meaningful tokens (shorter sequences, easier copying).
    """
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*(_TRAINING_TEXT * 4), *texts], trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_qwen3(vocab_size: int, seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A random ``Qwen3ForCausalLM`` with GQA (4 query heads over 2 key/value heads)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=32768,  # room for tool-heavy prompts (the τ³ policy + 16 tool schemas)
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).eval()


def save_tiny_checkpoint(
    directory: str | Path,
    with_model: bool = False,
    seed: int = 0,
    shape: TinyShape | None = None,
    texts: Sequence[str] = (),
) -> Path:
    """Write the tiny tokenizer (and optionally a random model of ``shape``) where ``from_pretrained`` finds it.

    ``texts``: extra BPE training text for the tokenizer (see :func:`build_tiny_tokenizer`).
    """
    shape = shape or TinyShape()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(shape.vocab_size, texts)
    tokenizer.save_pretrained(directory)
    if with_model:
        model = build_tiny_qwen3(len(tokenizer), seed=seed, hidden_size=shape.hidden_size, num_layers=shape.num_layers)
        model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.save_pretrained(directory)
    return directory
