"""The probes' chance level (probes/chance.py) against a format-only predictor estimated from generated
probes: per answer position, the most frequent token among half of the probes, scored on the other half.
After chance correction it scores 0 within 0.01 on every task; for the 16-token numeric answers (a space and
15 digits, the first non-zero) the chance is (1 + 1/9 + 14/10) / 16 = 0.157, where exp(-chance loss) gave
0.116."""

import math
from collections import Counter

import numpy as np
import pytest

from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.probes.chance import value_chances
from hybrid_lightning.probes.tasks import GenContext, make_sample

TOK = ByteTokenizer()
ESSAY = TOK.encode("The river ran past the mill. A miller lived there with his three sons and a cat. " * 200)
PROBES = 600


def estimated_minus_recorded(task, value_tokens, length=1024):
    ctx = GenContext(TOK, ESSAY, value_tokens, vt_example=False)
    samples = [make_sample(task, ctx, length, 0.5, i, seed=7) for i in range(PROBES)]
    fit, held = samples[::2], samples[1::2]
    modes = {}  # answer position -> the most frequent token there among the fitted half
    for s in fit:
        for j, t in enumerate(s.answer):
            modes.setdefault(j, Counter())[int(t)] += 1
    correct = sum(int(t) == modes[j].most_common(1)[0][0] for s in held for j, t in enumerate(s.answer) if j in modes)
    tokens = sum(len(s.answer) for s in held)
    recorded = sum(s.chance_correct for s in held) / tokens
    return correct / tokens - recorded, recorded, sum(s.chance_nll for s in held) / tokens


@pytest.mark.parametrize("task, value_tokens", [("niah_single_1", 16), ("niah_single_1", None), ("passkey", None),
                                                ("niah_multikey_3", None), ("niah_multivalue", None), ("vt", None)])
def test_format_only_predictor_scores_zero_after_chance_correction(task, value_tokens):
    difference, recorded, chance_loss = estimated_minus_recorded(task, value_tokens)
    assert abs(difference) <= 0.01, (task, difference, recorded)
    if (task, value_tokens) == ("niah_single_1", 16):
        assert recorded == pytest.approx((1 + 1 / 9 + 14 / 10) / 16)
        assert math.exp(-chance_loss) == pytest.approx(0.116, abs=1e-3)  # the level the records held before


def test_value_chances_from_the_generators():
    assert value_chances("numbers", "1234567") == pytest.approx([1 / 9] + [0.1] * 6)
    assert value_chances("numbers", "12", then=",") == pytest.approx([1 / 9, 0.1, 1.0])
    uuid = value_chances("uuids", "6f1c4f0e-3b5a-4d2e-9c1a-0123456789ab")
    assert uuid[8] == uuid[13] == uuid[14] == 1.0 and uuid[19] == 0.25 and uuid[0] == 1 / 16
    # passkeys 1..50000: the first digit is 1-4 with 11,111 of the 50,000 values each
    keys = tuple(str(k) for k in range(1, 50001))
    assert value_chances("passkey", "4", vocabulary=keys)[0] == pytest.approx(11111 / 50000)
    # words: 'ab' and 'abc' among the adjectives: after 'ab' the end ('-') and 'c' tie
    lists = (("ab", "abc", "x"), ("cat", "cow"))
    assert value_chances("words", "ab-cat", vocabulary=lists) == pytest.approx([2 / 3, 1, 1 / 2, 1, 1 / 2, 1])
    assert np.isclose(sum(value_chances("names", "ABCDE")), 5 / 26)
