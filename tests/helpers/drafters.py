"""Test drafters for parity checks. They know the plain-decoding output (`truth`) of the same prompt."""

import numpy as np

from guild.speculative.base import Drafter


class OracleDrafter(Drafter):
    """Proposes the true continuation: every draft is accepted."""

    name = "oracle"

    def __init__(self, prompt_len, truth):
        self.prompt_len, self.truth = prompt_len, list(truth)

    def propose(self, history, k):
        i = len(history) - self.prompt_len  # tokens generated so far
        return np.array(self.truth[i : i + k], np.int32)


class AdversarialDrafter(OracleDrafter):
    """Always wrong at the first draft position (and after)."""

    name = "adversarial"

    def propose(self, history, k):
        good = super().propose(history, k)
        return (good + 1) % 49152


class RandomDrafter(OracleDrafter):
    """Each draft position is the true token with probability p_true, else a random token."""

    name = "random"

    def __init__(self, prompt_len, truth, seed=0, p_true=0.6, vocab=49152):
        super().__init__(prompt_len, truth)
        self.rng, self.p_true, self.vocab = np.random.default_rng(seed), p_true, vocab

    def propose(self, history, k):
        good = super().propose(history, k)
        rnd = self.rng.integers(0, self.vocab, good.size)
        return np.where(self.rng.random(good.size) < self.p_true, good, rnd).astype(np.int32)
