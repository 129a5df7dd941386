"""Recurrent text models as users write them in plain torch, through both of torch's exporters, for `benchmarks.bench_recurrent`.

    <python with torch + onnx [+ onnxscript]> -m benchmarks.suite.recurrent_export [--out DIR] [--exporter ts dynamo]
        [--models lstm_cls_last ...]

Runs in any Python that has torch and onnx (plus onnxscript for the dynamo exporter), not in quantsim's
environment: quantsim never imports torch. Nothing is downloaded: every model is built from ``torch.nn`` with
seeded random weights (embeddings N(0, 1), torch's default initialisation elsewhere). The models: an LSTM
sentiment classifier on the last hidden state; a bidirectional 2-layer LSTM with masked mean pooling over time
(a float padding mask input); a BiGRU tagger (per-token logits); a char-level ``nn.RNN`` (tanh) language model;
the same with an explicit hidden-state input and output for step-by-step decoding; torch's word language
model example (2-layer LSTM, decoder weight tied to the embedding); an LSTM over
``pack_padded_sequence`` (token ids + lengths); an ``LSTMCell`` loop unrolled in Python; a GRU encoder-decoder
with Luong (dot, ``bmm`` + softmax over the encoder states) and with Bahdanau (additive) attention, greedy for a
few steps (the argmax token is fed back through the embedding); a CNN + BiLSTM + CTC-style text-recogniser head
on a text-line image. Files: ``DIR/<model>.<exporter>.onnx`` (``ts``: TorchScript, ``dynamo=False``, opset 17;
``dynamo``: torch.export-based, opset 18) and ``DIR/<model>.npz``: a few valid feeds (token ids inside the
vocabulary, lengths, masks), keys ``<input>__<i>``. Weights are random: the files test op coverage and
sim/export agreement, not accuracy.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.suite.exporting import torch_exports_main, torch_onnx_export

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "recurrent"
VOCAB, CHARS, PAD = 1000, 80, 0
BATCH, STEPS = 2, 12
FEEDS = 6


def _modules():  # noqa: C901 - one place holding every model's class
    import torch
    from torch import nn

    class LstmLast(nn.Module):
        """Embedding + 2-layer LSTM + Linear on the top layer's last hidden state."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64, padding_idx=PAD)
            self.rnn = nn.LSTM(64, 96, num_layers=2, batch_first=True)
            self.head = nn.Linear(96, 2)

        def forward(self, ids):
            _, (h, _) = self.rnn(self.embed(ids))
            return self.head(h[-1])

    class BiLstmMean(nn.Module):
        """Embedding + bidirectional 2-layer LSTM + mean over the unpadded steps (float mask) + Linear."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64, padding_idx=PAD)
            self.rnn = nn.LSTM(64, 64, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(128, 3)

        def forward(self, ids, mask):
            out, _ = self.rnn(self.embed(ids))
            pooled = (out * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
            return self.head(pooled)

    class BiGruTagger(nn.Module):
        """Embedding + BiGRU + per-token Linear (a POS/NER tagger)."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 48)
            self.rnn = nn.GRU(48, 64, batch_first=True, bidirectional=True)
            self.head = nn.Linear(128, 9)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])

    class CharRnn(nn.Module):
        """Char-level language model: Embedding + 2-layer tanh RNN + Linear to the vocabulary."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(CHARS, 32)
            self.rnn = nn.RNN(32, 128, num_layers=2, batch_first=True, nonlinearity="tanh")
            self.head = nn.Linear(128, CHARS)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])

    class CharRnnStep(CharRnn):
        """The char RNN for step-by-step decoding: the hidden state is an input and an output."""

        def forward(self, ids, hidden):
            out, hidden = self.rnn(self.embed(ids), hidden)
            return self.head(out), hidden

    class LstmPacked(nn.Module):
        """Embedding + LSTM over ``pack_padded_sequence`` (lengths input) + Linear on the last valid state."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64, padding_idx=PAD)
            self.rnn = nn.LSTM(64, 80, batch_first=True)
            self.head = nn.Linear(80, 2)

        def forward(self, ids, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
            _, (h, _) = self.rnn(packed)
            return self.head(h[-1])

    class WordLm(nn.Module):
        """torch's word_language_model example: Embedding + 2-layer LSTM + Linear decoder whose weight is the
        embedding's (``tie_weights``), per-token logits over the vocabulary."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64)
            self.rnn = nn.LSTM(64, 64, num_layers=2, batch_first=True)
            self.decoder = nn.Linear(64, VOCAB)
            self.decoder.weight = self.embed.weight

        def forward(self, ids):
            return self.decoder(self.rnn(self.embed(ids))[0])

    class CellLoop(nn.Module):
        """An ``LSTMCell`` stepped in a Python loop (unrolled by the exporter) + Linear on the last state."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 48)
            self.cell = nn.LSTMCell(48, 64)
            self.head = nn.Linear(64, 2)

        def forward(self, ids):
            x = self.embed(ids)
            h = x.new_zeros(x.shape[0], 64)
            c = x.new_zeros(x.shape[0], 64)
            for t in range(x.shape[1]):
                h, c = self.cell(x[:, t], (h, c))
            return self.head(h)

    class Seq2Seq(nn.Module):
        """GRU encoder + GRUCell decoder with attention over the encoder states, greedy for a few steps."""

        def __init__(self, additive: bool, steps: int = 4):
            super().__init__()
            self.additive, self.steps = additive, steps
            self.src = nn.Embedding(VOCAB, 48)
            self.tgt = nn.Embedding(VOCAB, 48)
            self.encoder = nn.GRU(48, 64, batch_first=True)
            self.cell = nn.GRUCell(48 + 64, 64)
            if additive:  # Bahdanau: v^T tanh(W_q s + W_k h)
                self.wq, self.wk, self.v = nn.Linear(64, 64, bias=False), nn.Linear(64, 64), nn.Linear(64, 1, bias=False)
            self.out = nn.Linear(128, VOCAB)

        def attend(self, enc, keys, state):
            if self.additive:
                scores = self.v(torch.tanh(self.wq(state).unsqueeze(1) + keys)).squeeze(-1)
            else:  # Luong dot
                scores = torch.bmm(enc, state.unsqueeze(-1)).squeeze(-1)
            weights = torch.softmax(scores, dim=-1)
            return torch.bmm(weights.unsqueeze(1), enc).squeeze(1)

        def forward(self, src):
            enc, h = self.encoder(self.src(src))
            keys = self.wk(enc) if self.additive else enc
            state = h[0]
            token = src.new_ones(src.shape[0])  # BOS = 1
            context = self.attend(enc, keys, state)
            logits_all = []
            for _ in range(self.steps):
                state = self.cell(torch.cat([self.tgt(token), context], -1), state)
                context = self.attend(enc, keys, state)
                logits = self.out(torch.cat([state, context], -1))
                logits_all.append(logits)
                token = logits.argmax(-1)
            return torch.stack(logits_all, 1)

    class CrnnCtc(nn.Module):
        """Text-line recogniser: a small CNN over a 32-pixel-high line image, BiLSTM over its columns, per-column
        class log-probabilities (CTC head; class 0 is the blank)."""

        def __init__(self):
            super().__init__()
            def conv(cin, cout, pool):
                return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(pool)]
            self.cnn = nn.Sequential(*conv(1, 32, 2), *conv(32, 64, 2), *conv(64, 96, (2, 1)), *conv(96, 96, (4, 1)))
            self.rnn = nn.LSTM(96, 64, batch_first=True, bidirectional=True)
            self.head = nn.Linear(128, CHARS)

        def forward(self, image):
            features = self.cnn(image).squeeze(2).permute(0, 2, 1)  # (N, W/4, C)
            return torch.log_softmax(self.head(self.rnn(features)[0]), -1)

    return {"lstm_cls_last": LstmLast, "bilstm_cls_mean": BiLstmMean, "bigru_tagger": BiGruTagger,
            "char_rnn_lm": CharRnn, "char_rnn_step": CharRnnStep, "word_lm_tied": WordLm, "lstm_packed": LstmPacked,
            "lstmcell_loop": CellLoop, "seq2seq_luong": lambda: Seq2Seq(False), "seq2seq_bahdanau": lambda: Seq2Seq(True),
            "crnn_ctc": CrnnCtc}


MODELS = ("lstm_cls_last", "bilstm_cls_mean", "bigru_tagger", "char_rnn_lm", "char_rnn_step", "word_lm_tied", "lstm_packed",
          "lstmcell_loop", "seq2seq_luong", "seq2seq_bahdanau", "crnn_ctc")


def feeds(name: str, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``FEEDS`` valid inputs for ``name``: token ids in ``[1, vocabulary)`` with a padded tail (id 0) where the
    model takes lengths or a mask, lengths in ``[3, STEPS]`` (the longest one at full length), masks 1/0."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(FEEDS):
        if name == "crnn_ctc":
            line = rng.uniform(0.0, 1.0, (1, 1, 32, 128)).astype(np.float32)
            line[..., :, rng.integers(0, 128, 40)] *= 0.2  # dark strokes on a bright page
            out.append({"image": line})
            continue
        vocab = CHARS if name.startswith("char_rnn") else VOCAB
        if name == "char_rnn_step":
            out.append({"ids": rng.integers(1, vocab, (1, 1)).astype(np.int64),
                        "hidden": np.tanh(rng.standard_normal((2, 1, 128))).astype(np.float32)})  # a tanh state
            continue
        ids = rng.integers(1, vocab, (BATCH, STEPS)).astype(np.int64)
        lengths = np.array([STEPS, rng.integers(3, STEPS + 1)], dtype=np.int64)
        if i % 2:
            lengths = lengths[::-1].copy()
        mask = (np.arange(STEPS)[None, :] < lengths[:, None])
        if name in ("bilstm_cls_mean", "lstm_packed"):
            ids = np.where(mask, ids, PAD)
        feed = {"ids": ids}
        if name == "bilstm_cls_mean":
            feed["mask"] = mask.astype(np.float32)
        if name == "lstm_packed":
            feed["lengths"] = lengths
        out.append(feed)
    return out


def export(name: str, exporter: str, out: Path) -> Path:
    import torch

    torch.manual_seed(0)
    model = _modules()[name]()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight)
        if isinstance(module, torch.nn.BatchNorm2d):  # statistics of four batches of line images
            module.momentum = None
    examples = feeds(name)
    if name == "crnn_ctc":
        model.train()
        with torch.no_grad():
            for feed in examples[:4]:
                model(torch.from_numpy(feed["image"]))
    model.eval()
    np.savez(out / f"{name}.npz", **{f"{k}__{i}": v for i, feed in enumerate(examples) for k, v in feed.items()})
    args = tuple(torch.from_numpy(v) for v in examples[0].values())
    names = list(examples[0])
    outputs = ["logits", "hidden_out"] if name == "char_rnn_step" else ["output"]
    target = out / f"{name}.{exporter}.onnx"
    return torch_onnx_export(model, args, target, exporter, names, outputs)


def main(argv: list[str] | None = None) -> int:
    return torch_exports_main(argv, __doc__.split("\n")[0], DEFAULT_OUT, list(MODELS), export)


if __name__ == "__main__":
    raise SystemExit(main())
