"""Sentence inputs for paraphrase-MiniLM-L3-v2: a small BERT WordPiece tokenizer, mean pooling, cosine.

The tokenizer follows BERT's ``BasicTokenizer`` + ``WordpieceTokenizer`` (what the model's
``BertTokenizer`` with ``do_lower_case=True`` does):

* clean: drop NUL, U+FFFD and control characters, map whitespace characters to a space;
* put spaces around CJK ideographs;
* lower-case, then strip accents (NFD, drop combining marks), as ``do_lower_case`` implies;
* split on whitespace, then split every punctuation character off as its own token
  (ASCII symbols count as punctuation, as in BERT);
* WordPiece: greedy longest-match-first against the vocab, continuation pieces prefixed ``##``;
  a word longer than ``max_chars_per_word`` or with no full segmentation becomes ``[UNK]``;
* ``[CLS] tokens [SEP]``, truncated to ``max_length``; batches padded with ``[PAD]`` to the longest
  row, with ``attention_mask`` and all-zero ``token_type_ids``.

All pure Python / numpy; the model's vocab is read from ``vocab.txt`` (one token a line, id = line).
"""
from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

SENTENCES_FILE = Path(__file__).resolve().parent / "sentences.txt"


def load_sentences(path: str | os.PathLike = SENTENCES_FILE) -> list[str]:
    """Non-empty, non-comment lines of the sentences data file."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """``vocab.txt`` -> token -> id (the line number)."""
    vocab: dict[str, int] = {}
    for i, tok in enumerate(Path(path).read_text(encoding="utf-8").split("\n")):
        tok = tok.rstrip("\r")
        if tok and tok not in vocab:
            vocab[tok] = i
    return vocab


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text: str, lower: bool = True) -> list[str]:
    """BERT basic tokenisation: clean, CJK spacing, lower-case + strip accents, whitespace/punctuation split."""
    chars = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        if _is_whitespace(ch):
            chars.append(" ")
        elif _is_cjk(cp):
            chars.extend((" ", ch, " "))
        else:
            chars.append(ch)
    out: list[str] = []
    for word in "".join(chars).split():
        if lower:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    out.append(current)
                    current = ""
                out.append(ch)
            else:
                current += ch
        if current:
            out.append(current)
    return out


def wordpiece(word: str, vocab: Mapping[str, int], unk: str = "[UNK]", max_chars_per_word: int = 100) -> list[str]:
    """Greedy longest-match-first split of one word into vocab pieces (``##`` marks continuations)."""
    if len(word) > max_chars_per_word:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in vocab:
                piece = sub
                break
            end -= 1
        if piece is None:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


class WordPieceTokenizer:
    """Uncased BERT tokenizer over a vocab dict (see the module docstring)."""

    def __init__(self, vocab: Mapping[str, int], lower: bool = True, max_length: int = 128,
                 cls: str = "[CLS]", sep: str = "[SEP]", pad: str = "[PAD]", unk: str = "[UNK]"):
        missing = [t for t in (cls, sep, pad, unk) if t not in vocab]
        if missing:
            raise ValueError(f"vocab lacks special tokens {missing}")
        self.vocab, self.lower, self.max_length = dict(vocab), lower, max_length
        self.cls, self.sep, self.pad, self.unk = cls, sep, pad, unk

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike, max_length: int = 128) -> WordPieceTokenizer:
        import json

        d = Path(model_dir)
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        return cls(load_vocab(d / "vocab.txt"), lower=bool(cfg.get("do_lower_case", True)), max_length=max_length)

    def tokenize(self, text: str) -> list[str]:
        return [p for w in basic_tokenize(text, self.lower) for p in wordpiece(w, self.vocab, self.unk)]

    def encode(self, text: str) -> list[int]:
        toks = self.tokenize(text)[: self.max_length - 2]
        return [self.vocab[self.cls]] + [self.vocab[t] for t in toks] + [self.vocab[self.sep]]

    def batch(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, ``[N, longest]``), right-padded."""
        rows = [self.encode(t) for t in texts]
        n, width = len(rows), max((len(r) for r in rows), default=0)
        ids = np.full((n, width), self.vocab[self.pad], dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def feeds(tokenizer: WordPieceTokenizer, sentences: Sequence[str], batch_size: int,
          input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Feed dicts of ``batch_size`` sentences, keeping only the inputs the model declares."""
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer.batch(sentences[i:i + batch_size])
        missing = [k for k in input_names if k not in enc]
        if missing:
            raise ValueError(f"model wants inputs the tokenizer does not make: {missing}")
        out.append({k: enc[k] for k in input_names})
    return out


def mean_pool(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the token embeddings where ``attention_mask`` is 1 (``[N, T, D]``, ``[N, T]`` -> ``[N, D]``)."""
    m = attention_mask.astype(np.float64)[..., None]
    return ((token_embeddings * m).sum(1) / np.maximum(m.sum(1), 1e-9)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``[N, D]`` arrays."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(den, 1e-12)
