"""Acceptance formulas against Leviathan et al. 2023 and vLLM's counter definitions (design.md §2)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from advisor import costmodel as cm
from advisor.costmodel.acceptance import model_from_input


@pytest.mark.parametrize(("alpha", "k", "expected"), [
    (0.8, 4, 3.3616),  # (1 − 0.8^5)/0.2 = (1 − 0.32768)/0.2
    (0.6, 2, 1.96),  # (1 − 0.216)/0.4
    (0.5, 1, 1.5),  # one draft: 1 + α
    (0.0, 5, 1.0),  # nothing accepted: bonus token only
])
def test_leviathan_eq1_expected_tokens(alpha, k, expected):
    assert cm.expected_tokens_iid(alpha, k) == pytest.approx(expected, abs=1e-4)


def test_eq1_alpha_one_gives_k_plus_one():
    assert cm.expected_tokens_iid(1.0, 7) == 8.0


@pytest.mark.parametrize(("alpha", "k", "c", "expected"), [
    (0.8, 4, 0.05, 3.3616 / 1.2),  # Thm 3.8: (1−α^(k+1)) / ((1−α)(kc+1))
    (0.6, 2, 0.1, 1.96 / 1.2),
    (0.9, 3, 0.0, (1 - 0.9 ** 4) / 0.1),  # free drafter: the improvement is E[tokens]
])
def test_leviathan_thm38_walltime_improvement(alpha, k, c, expected):
    assert cm.walltime_improvement_iid(alpha, k, c) == pytest.approx(expected, rel=1e-4)


def test_thm38_below_one_when_drafter_is_expensive():
    assert cm.walltime_improvement_iid(0.3, 4, 0.5) < 1.0


@pytest.mark.parametrize(("al", "k"), [(2.04, 2), (2.296, 3), (3.61, 5), (1.2, 6)])
def test_alpha_from_al_inverts_eq1(al, k):
    alpha = cm.alpha_from_al(al, k)
    assert cm.expected_tokens_iid(alpha, k) == pytest.approx(al, abs=1e-9)


def test_alpha_from_al_rejects_impossible_al():
    with pytest.raises(cm.CostModelError) as err:
        cm.alpha_from_al(3.5, 2)
    assert err.value.field == "acceptance.mean_acceptance_length"


def test_al_from_per_position_is_one_plus_sum():
    assert float(cm.al_from_per_position(np.array([0.8, 0.6, 0.3, 0.1]), 3)) == pytest.approx(2.7)


def test_iid_model_reproduces_alpha_powers():
    al = cm.expected_tokens_iid(0.7, 4)  # the AL an i.i.d. α = 0.7 gives at k = 4
    model = model_from_input(cm.AcceptanceInput(mean_acceptance_length=al), 4, "eagle", "prose", None)
    r = cm.per_position_rates(model, 0.0, 4)
    assert r == pytest.approx([0.7, 0.49, 0.343, 0.2401], rel=1e-6)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_acceptance_rate_is_vllm_accepted_over_drafted(k):
    """Issue 9: acceptance_rate means vLLM's A/D (not an i.i.d. α): AL = 1 + k·ρ at the stated k."""
    model = model_from_input(cm.AcceptanceInput(acceptance_rate=0.6), k, "eagle", "prose", None)
    r = cm.per_position_rates(model, 0.0, k)
    assert float(cm.al_from_per_position(r, k)) == pytest.approx(1 + k * 0.6, abs=1e-6)
    assert float(r.sum() / k) == pytest.approx(0.6, abs=1e-6)


@pytest.mark.parametrize("rates", [[0.8, 0.8, 0.8], [1.0, 1.0], [0.5, 0.5, 0.2, 0.2], [0.0, 0.0], [1.0, 0.0]])
def test_per_position_with_equal_neighbours_is_finite(rates):
    """Issue 9: equal neighbours made the conditional rate 1 and its logit infinite (NaN fit)."""
    model = model_from_input(cm.AcceptanceInput(per_position=tuple(rates)), len(rates), "eagle", "prose", None)
    assert all(math.isfinite(x) for x in (model.logit_intercept, model.logit_position_slope))
    assert np.all(np.isfinite(cm.per_position_rates(model, 0.0, len(rates))))


def test_given_al_reproduced_at_its_k():
    model = model_from_input(cm.AcceptanceInput(mean_acceptance_length=2.3), 3, "eagle", "prose", None)
    assert float(cm.al_from_per_position(cm.per_position_rates(model, 0.0, 3), 3)) == pytest.approx(2.3, abs=1e-6)


def test_priors_structure_and_temperature_order():
    al = {}
    for structure in ("json", "prose", "creative"):
        for t in (0.0, 1.0):
            prior = cm.prior_acceptance("draft_model", structure)
            al[structure, t] = float(cm.al_from_per_position(cm.per_position_rates(prior, t, 4), 4))
    assert al["json", 0.0] > al["prose", 0.0] > al["creative", 0.0]
    assert al["prose", 1.0] < al["prose", 0.0]
    assert prior.source.startswith("prior:")


def test_ngram_prior_prefers_rag_and_drafts_only_sometimes():
    rag, prose = cm.prior_acceptance("ngram", "rag"), cm.prior_acceptance("ngram", "prose")
    assert rag.draft_fraction > prose.draft_fraction
    assert 0 < prose.draft_fraction < 1
    assert not math.isnan(rag.logit_intercept)


def test_bigger_draft_model_gets_higher_prior(models):
    t = models["llama-3.1-8b-instruct"]
    small = cm.prior_acceptance("draft_model", "prose", t, models["qwama-0.5b-instruct"])
    big = cm.prior_acceptance("draft_model", "prose", t, models["llama-3.2-3b-instruct"])
    assert big.logit_intercept > small.logit_intercept


def test_a_calibrated_intercept_is_read_along_the_output_once_and_no_further_than_the_share():
    """acceptance.at_output: a + slope · ln(O / reference), O capped where the drafting share is (twice the probes'
    longest output); the slope is spent, so a model read twice moves once; no slope (priors, stated words) or no
    output: the model itself."""
    import dataclasses

    from advisor.costmodel.acceptance import al_from_per_position, at_output, per_position_rates
    from advisor.costmodel.types import AcceptanceModel

    model = AcceptanceModel("ngram", None, "json", 0.4, -0.3, -0.5, logit_output_slope=0.6,
                            logit_output_ref_tokens=100.0, draft_fraction_output_tokens_up_to=200.0)
    short = at_output(model, 50)
    assert short.logit_intercept == pytest.approx(0.4 + 0.6 * math.log(0.5)) and short.logit_output_slope == 0.0
    assert at_output(short, 400) is short
    assert at_output(model, 100).logit_intercept == pytest.approx(0.4)
    assert at_output(model, 10_000).logit_intercept == at_output(model, 200).logit_intercept
    assert al_from_per_position(per_position_rates(short, 0.0, 4), 4) < al_from_per_position(
        per_position_rates(model, 0.0, 4), 4)
    plain = dataclasses.replace(model, logit_output_slope=0.0)
    assert at_output(plain, 50) is plain and at_output(model, None) is model
