"""The deterministic "model" behind `FakeTGIServer`: character tokens, echo generation, fixed logprobs.

Tokenisation: a BOS token (id 1, ``<s>``) then one token per character, id = code point + 3 (ids 0-2 are
the special ``<unk>``, ``<s>``, ``</s>``). Greedy generation echoes the input's characters, then emits EOS
(``</s>``, special, no text). Sampling shuffles the input's characters with a generator seeded by the
request's seed (a random one when none is given, as TGI does). Under a grammar the generated text is the
shortest one that satisfies it (`_minimal_match`), then EOS. Every token's logprob is a fixed function
of the previous character and the token, so a test can compute any prefill or generated logprob itself
with `token_logprob`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ...adapters._minimal_match import minimal_json, minimal_regex_match

__all__ = ["BOS_ID", "EOS_ID", "FakeModel", "Generation", "TokenInfo", "adapter_salt", "token_logprob"]

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_OFFSET = 3
_SPECIAL = {UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def token_logprob(previous: str, token: str, adapter: str | None = None) -> float:
    """The fake model's logprob of ``token`` (one character, or ``"</s>"``) after character ``previous``.

    A LoRA adapter (its id) lowers every logprob by its own salt, so its scores differ from the base's.
    """
    prev = ord(previous[-1]) if previous else 1
    tok = sum(map(ord, token))
    return -((prev * 31 + tok) % 13 + 1) / 10 - adapter_salt(adapter)


def adapter_salt(adapter: str | None) -> float:
    """How much adapter ``adapter`` lowers each logprob (0 for the base): 0.01 to 0.07, by its name."""
    return 0.0 if adapter is None else (sum(map(ord, adapter)) % 7 + 1) / 100


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """One token: id, text, logprob (``None`` for the first prefill token) and whether it is special."""

    id: int
    text: str
    logprob: float | None
    special: bool = False


@dataclass(slots=True)
class Generation:
    """What one generation produced; ``text`` includes a matched stop sequence, as TGI's does."""

    text: str
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str = "length"
    seed: int | None = None


class FakeModel:
    """Tokenises, scores and generates deterministically; see the module docstring."""

    model_id = "asyncbackends/fake-echo"

    @staticmethod
    def token_id(char: str) -> int:
        """The id of a one-character token."""
        return ord(char) + _OFFSET

    @staticmethod
    def token_text(token_id: int) -> str:
        """The text of a token id."""
        return _SPECIAL.get(token_id) or chr(token_id - _OFFSET)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[tuple[int, str, int, int]]:
        """``(id, text, start, stop)`` per token, offsets in characters; BOS spans ``(0, 0)``."""
        tokens = [(BOS_ID, "<s>", 0, 0)] if add_special_tokens else []
        tokens.extend((self.token_id(c), c, i, i + 1) for i, c in enumerate(text))
        return tokens

    def num_tokens(self, text: str) -> int:
        """Input tokens of ``text``, BOS included."""
        return len(text) + 1

    def prefill(self, text: str, adapter: str | None = None) -> list[TokenInfo]:
        """The prefill tokens of ``text``: BOS without a logprob, then each character given the previous."""
        out = [TokenInfo(BOS_ID, "<s>", None)]
        previous = ""
        for char in text:
            out.append(TokenInfo(self.token_id(char), char, token_logprob(previous, char, adapter)))
            previous = char
        return out

    def generate(
        self,
        text: str,
        *,
        max_new_tokens: int,
        do_sample: bool,
        seed: int | None,
        stop: list[str],
        truncate: int | None = None,
        grammar: tuple[str, Any] | None = None,
        adapter: str | None = None,
    ) -> Generation:
        """Echo (greedy) or a seeded shuffle (sampling) of ``text``'s characters, then EOS.

        With a LoRA ``adapter`` (a served one's id) the echo starts with ``[adapter] `` (as the mock's
        adapters answer) and every logprob is lowered by its salt (`adapter_salt`).

        Raises:
            NoMatchError: ``grammar`` (``("regex", pattern)`` or ``("json", schema)``) defeats the generator.
        """
        if truncate is not None and truncate < len(text):
            text = text[len(text) - truncate :]  # TGI truncates from the left
        chars = list(f"[{adapter}] " + text if adapter is not None else text)
        used_seed: int | None = None
        if grammar is not None:
            kind, value = grammar
            chars = list(minimal_regex_match(value) if kind == "regex" else minimal_json(value))
        elif do_sample:
            used_seed = seed if seed is not None else random.getrandbits(63)
            random.Random(used_seed).shuffle(chars)
        out = Generation("", seed=used_seed)
        previous = text[-1:] if text else ""
        for char in chars[:max_new_tokens]:
            out.tokens.append(TokenInfo(self.token_id(char), char, token_logprob(previous, char, adapter)))
            out.text += char
            previous = char
            if any(out.text.endswith(s) for s in stop):
                out.finish_reason = "stop_sequence"
                return out
        if len(out.tokens) < max_new_tokens:
            eos = token_logprob(previous, "</s>", adapter)
            out.tokens.append(TokenInfo(EOS_ID, "</s>", eos, special=True))
            out.finish_reason = "eos_token"
        return out
