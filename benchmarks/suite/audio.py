"""Speech-like audio for Silero VAD and its frame metric (synthetic: see below).

None of the wheels checked holds recorded speech (scipy's test WAVs are tones and noise), so utterances are
synthesised with a source-filter model of voiced speech:

* source: a glottal pulse train (Rosenberg-like pulses) with a gliding pitch (90-260 Hz, speaker-wise
  base, per-syllable contour, 1% jitter), plus aspiration noise;
* filter: three formant resonators (F1-F3 of a random vowel per syllable, with bandwidths) as
  second-order IIR sections;
* syllables of 120-320 ms with attack/decay envelopes, some preceded by a fricative burst (band-passed
  noise); words of 1-4 syllables, pauses of 60-900 ms between words;
* background: white or red (AR(1)) noise 30-50 dB below the speech peak everywhere, and in some clips non-speech distractors
  (mains hum with harmonics 35-50 dB, knock-like decaying bursts 6-20 dB below the speech peak).

Ground truth is the set of samples inside syllables. Silero VAD v5's sequence model takes
``[chunks, 576]``: each 512-sample chunk at 16 kHz prefixed by the previous chunk's last 64 samples
(zeros before the first); its output is one speech probability per chunk, thresholded at 0.5.
"""
from __future__ import annotations

import numpy as np

SR = 16000
CHUNK = 512
CONTEXT = 64
THRESH = 0.5
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410), (440, 1020, 2240), (490, 1350, 1690), (390, 1990, 2550), (640, 1190, 2390))


def _resonator(x: np.ndarray, freq: float, bw: float, sr: int = SR) -> np.ndarray:
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bw / sr)
    a = [1.0, -2 * r * np.cos(2 * np.pi * freq / sr), r * r]
    return lfilter([1 - r], a, x)


def _syllable(rng: np.random.Generator, n: int, f0: float) -> np.ndarray:
    t = np.arange(n) / SR
    contour = f0 * (1 + rng.uniform(-0.15, 0.15) * t / max(t[-1], 1e-3)) * (1 + 0.01 * rng.standard_normal(n))
    phase = np.cumsum(contour / SR)
    frac = phase % 1.0
    pulse = np.where(frac < 0.4, 0.5 * (1 - np.cos(np.pi * frac / 0.4)), np.cos(0.5 * np.pi * (frac - 0.4) / 0.2))
    pulse = np.diff(np.where(frac < 0.6, pulse, 0.0), prepend=0.0)  # glottal flow derivative
    src = pulse + 0.02 * rng.standard_normal(n)
    vowel = VOWELS[rng.integers(len(VOWELS))]
    out = sum(_resonator(src, f, bw) * g for f, bw, g in zip(vowel, (80, 100, 140), (1.0, 0.6, 0.3)))
    env = np.minimum(1.0, np.minimum(t / 0.025, (t[-1] - t) / 0.04 + 1e-3))
    return np.asarray(out) * env


def utterance(seconds: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 waveform in [-1, 1] at 16 kHz, bool per-sample speech truth) of one synthetic clip."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    wave, truth = np.zeros(n), np.zeros(n, dtype=bool)
    f0 = rng.uniform(90, 230)
    pos = int(rng.uniform(0.2, 0.8) * SR)
    while pos < n - SR // 4:
        for _ in range(rng.integers(1, 5)):  # a word
            if pos >= n - SR // 10:
                break
            if rng.random() < 0.4:  # fricative onset
                m = int(rng.uniform(0.04, 0.1) * SR)
                fric = _resonator(rng.standard_normal(m), rng.uniform(3000, 6000), 1500) * 0.3
                end = min(n, pos + m)
                wave[pos:end] += fric[: end - pos]
                truth[pos:end] = True
                pos = end
            m = int(rng.uniform(0.12, 0.32) * SR)
            end = min(n, pos + m)
            wave[pos:end] += _syllable(rng, m, f0 * rng.uniform(0.9, 1.15))[: end - pos]
            truth[pos:end] = True
            pos = end + int(rng.uniform(0.0, 0.04) * SR)
        pos += int(rng.uniform(0.06, 0.9) * SR)
    peak = np.abs(wave).max()
    level = rng.uniform(0.2, 0.8)  # speech peak
    wave = wave / peak * level if peak > 0 else wave
    noise = rng.standard_normal(n)
    if rng.random() < 0.5:  # red (AR(1)) noise: more energy at low frequencies, stationary
        from scipy.signal import lfilter

        noise = lfilter([1.0], [1.0, -0.95], noise)
    wave += noise / (np.std(noise) + 1e-9) * level * 10 ** (rng.uniform(-50, -30) / 20)  # 30-50 dB below the peak
    kind = seed % 3
    t = np.arange(n) / SR
    if kind == 1:  # mains hum with harmonics
        hum = sum(np.sin(2 * np.pi * 50 * k * t) / k for k in range(1, 6))
        wave += hum / np.abs(hum).max() * level * 10 ** (rng.uniform(-50, -35) / 20)
    elif kind == 2:  # knocks: decaying noise bursts
        for start in rng.integers(0, n - SR // 10, size=rng.integers(2, 6)):
            m = SR // 10
            burst = rng.standard_normal(m) * np.exp(-np.arange(m) / 200)
            wave[start:start + m] += burst / np.abs(burst).max() * level * 10 ** (rng.uniform(-20, -6) / 20)
    return np.clip(wave, -1, 1).astype(np.float32), truth


def chunk_input(wave: np.ndarray) -> np.ndarray:
    """``[chunks, CONTEXT + CHUNK]`` sequence-model input (trailing partial chunk dropped)."""
    k = len(wave) // CHUNK
    chunks = np.asarray(wave[: k * CHUNK], np.float32).reshape(k, CHUNK)
    ctx = np.zeros((k, CONTEXT), np.float32)
    ctx[1:] = chunks[:-1, -CONTEXT:]
    return np.concatenate([ctx, chunks], axis=1)


def chunk_truth(truth: np.ndarray, min_share: float = 0.5) -> np.ndarray:
    """Per-chunk speech truth: at least ``min_share`` of the chunk's samples are speech."""
    k = len(truth) // CHUNK
    return truth[: k * CHUNK].reshape(k, CHUNK).mean(1) >= min_share


def frame_agreement(ref: np.ndarray, hyp: np.ndarray, thresh: float = THRESH) -> float:
    """Share of chunks whose speech decision (probability > ``thresh``) is the same in both."""
    a, b = np.asarray(ref).ravel() > thresh, np.asarray(hyp).ravel() > thresh
    if a.shape != b.shape:
        raise ValueError(f"probability shapes differ: {a.shape} vs {b.shape}")
    return float(np.mean(a == b)) if a.size else 1.0
