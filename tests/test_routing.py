import math

import pytest
import torch

from experts_int8 import select_experts


def test_softmax_topk_hand_computed():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    w, ids = select_experts(logits, 2, renormalize=False)
    p = torch.softmax(logits, -1)[0]
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(w[0], p[[1, 2]])
    w, _ = select_experts(logits, 2, renormalize=True)
    e3, e2 = math.exp(3), math.exp(2)
    torch.testing.assert_close(w[0], torch.tensor([e3 / (e3 + e2), e2 / (e3 + e2)]))


def test_sigmoid_scoring_and_scaling():
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    w, ids = select_experts(logits, 1, scoring="sigmoid", renormalize=False, routed_scaling_factor=2.5)
    assert ids.tolist() == [[1]]
    torch.testing.assert_close(w, torch.tensor([[2.5 / (1 + math.exp(-2.0))]]))


def test_sigmoid_renormalize_stays_finite_when_every_score_underflows():
    """Logits of -200 give sigmoid scores of 0: the sum gets 1e-20 (as the sigmoid routers of DeepSeek-V3 and
    GLM-4-MoE add), so the weights are 0, not 0/0; ordinary scores are unmoved by it."""
    w, _ = select_experts(torch.full((1, 8), -200.0), 2, scoring="sigmoid")
    assert torch.equal(w, torch.zeros(1, 2))
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    w, _ = select_experts(logits, 2, scoring="sigmoid")
    s = torch.sigmoid(logits)[0, [1, 0]]
    torch.testing.assert_close(w[0], s / s.sum())


def test_sqrtsoftplus_scoring_hand_computed():
    """DeepSeek-V4's scores: sqrt(log(1 + e^x)), the choice biased, the weights unbiased, renormalized and scaled;
    scores that all underflow give zero weights, not 0/0."""
    logits = torch.tensor([[0.0, 2.0, -1.0, 1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    w, ids = select_experts(logits, 2, scoring="sqrtsoftplus", correction_bias=bias, routed_scaling_factor=1.5)
    assert ids.tolist() == [[2, 1]]
    s = [math.sqrt(math.log1p(math.exp(x))) for x in (-1.0, 2.0)]
    torch.testing.assert_close(w[0], torch.tensor([1.5 * s[0] / sum(s), 1.5 * s[1] / sum(s)]))
    w, ids = select_experts(logits, 1, scoring="sqrtsoftplus", renormalize=False)
    assert ids.tolist() == [[1]]
    torch.testing.assert_close(w, torch.tensor([[math.sqrt(math.log1p(math.exp(2.0)))]]))
    w, _ = select_experts(torch.full((1, 8), -200.0), 2, scoring="sqrtsoftplus")
    assert torch.equal(w, torch.zeros(1, 2))


def test_grouped_topk_deepseek_v2_uses_group_max():
    # 4 groups of 2 experts. Group maxima: g0=0.9(e1), g1=0.5, g2=0.8, g3=0.85. Keep 2 groups: g0, g3.
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.45, 0.8, 0.0, 0.85, 0.84]])
    logits = scores.log()  # softmax(log p) = p / sum(p): same order, easy to reason about
    w, ids = select_experts(logits, 3, num_expert_group=4, topk_group=2, renormalize=False)
    assert sorted(ids[0].tolist()) == [1, 6, 7]  # e4 (0.8) is excluded: its group lost
    p = torch.softmax(logits, -1)[0]
    torch.testing.assert_close(w[0].sort().values, p[[1, 6, 7]].sort().values)


def test_deepseek_v3_bias_selects_but_weights_are_unbiased():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5, 0.2, 0.1]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    w, ids = select_experts(logits, 2, scoring="sigmoid", num_expert_group=4, topk_group=2,
                            correction_bias=bias, renormalize=True, routed_scaling_factor=2.0)
    s = torch.sigmoid(logits[0])
    b = s + bias
    # Group scores = sum of top-2 biased scores per group of 2.
    gs = b.view(4, 2).sum(-1)
    kept = gs.topk(2).indices.tolist()
    assert 1 in kept  # the group of expert 3 (boosted by the bias)
    allowed = [e for g in kept for e in (2 * g, 2 * g + 1)]
    expect = sorted(allowed, key=lambda e: -b[e].item())[:2]
    assert sorted(ids[0].tolist()) == sorted(expect)
    assert 3 in ids[0].tolist()
    raw = s[ids[0].long()]
    torch.testing.assert_close(w[0], raw / raw.sum() * 2.0)


def test_custom_routing_function():
    def first_k(logits, top_k, renormalize):
        m = logits.shape[0]
        ids = torch.arange(top_k).repeat(m, 1)
        return torch.full((m, top_k), 0.5, dtype=torch.float16), ids

    w, ids = select_experts(torch.randn(3, 4), 2, custom_routing_function=first_k, routed_scaling_factor=2.0)
    assert ids.dtype == torch.int32 and ids.tolist() == [[0, 1]] * 3
    assert w.dtype == torch.float32 and torch.all(w == 1.0)


def test_empty_batch():
    w, ids = select_experts(torch.randn(0, 8), 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=9), "top_k"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2, scoring="relu"), "scoring"),
        (dict(top_k=2, num_expert_group=3, topk_group=1), "divisible"),
        (dict(top_k=2, num_expert_group=4), "together"),
        (dict(top_k=5, num_expert_group=4, topk_group=2), "cannot hold"),
        (dict(top_k=2, correction_bias=torch.zeros(7)), "correction_bias"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_experts(torch.randn(3, 8), **kwargs)


def test_bad_logits():
    with pytest.raises(ValueError, match="2-D"):
        select_experts(torch.randn(8), 2)
    with pytest.raises(TypeError, match="floating"):
        select_experts(torch.ones(2, 8, dtype=torch.long), 2)


@pytest.mark.parametrize("jitter_eps", [0.01, 0.05])
def test_sparsemixer_matches_phimoe(jitter_eps):
    """PhiMoE's own sparsemixer (inference) against ours, with logits close enough that the masks vary."""
    phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    from experts_int8.routing import sparsemixer

    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) * 0.3 + 2.0
    want_w, want_ids = phimoe.sparsemixer(logits, jitter_eps=jitter_eps, training=False, top_k=2)
    w, ids = select_experts(logits, 2, renormalize=False, custom_routing_function=sparsemixer(jitter_eps))
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(w, want_w.float())
    best = logits.max(dim=-1, keepdim=True).values
    near = ((best - logits) / logits.abs().clamp(min=best) <= 2 * jitter_eps).sum(dim=-1)
    assert (near > 1).any() and (near < logits.shape[1]).all()  # the mask keeps more than one, never all
    with pytest.raises(ValueError, match="picks 2 experts"):
        select_experts(logits, 3, custom_routing_function=sparsemixer(jitter_eps))


def test_bad_arguments_are_named():
    logits = torch.randn(3, 8)
    for kw, match in ((dict(top_k=True), "top_k must be an int"),
                      (dict(top_k=2, num_expert_group=0, topk_group=1), "num_expert_group must be a positive int"),
                      (dict(top_k=2, num_expert_group=4, topk_group=1.5), "topk_group must be a positive int"),
                      (dict(top_k=2, correction_bias=[0.0] * 8), r"correction_bias must be a tensor of shape \(8,\)")):
        with pytest.raises(ValueError, match=match):
            select_experts(logits, **kw)
    with pytest.raises(TypeError, match="routed_scaling_factor must be a number"):
        select_experts(logits, 2, routed_scaling_factor="2")
    for factor in (float("nan"), float("inf"), 0.0, -1.0):  # (it scales every token's weights: all would be off)
        with pytest.raises(ValueError, match="routed_scaling_factor must be a finite number above 0"):
            select_experts(logits, 2, routed_scaling_factor=factor)


def test_custom_routing_function_is_checked_and_exclusive():
    logits = torch.randn(3, 8)

    def route(router_logits, top_k, renormalize):
        return select_experts(router_logits, top_k, renormalize=renormalize)

    w, ids = select_experts(logits, 2, custom_routing_function=route, routed_scaling_factor=2.0)
    want_w, want_ids = select_experts(logits, 2)
    assert torch.equal(ids, want_ids) and torch.allclose(w, 2 * want_w)
    with pytest.raises(ValueError, match=r"must return \(weights, ids\) of shape \(3, 2\), got \[\(3, 3\), \(3, 3\)\]"):
        select_experts(logits, 2, custom_routing_function=lambda r, k, n: route(r, 3, n))
    with pytest.raises(ValueError, match="do not apply to it"):
        select_experts(logits, 2, custom_routing_function=route, scoring="sigmoid")


def test_scores_in_the_logits_dtype():
    """Routers that score bf16 logits in bf16 (LFM2, Mistral 4) choose by bf16 values: rounding can tie two scores
    that fp32 tells apart, and then the correction bias decides; the weights come back in fp32 either way."""
    logits = torch.tensor([[1e-3, 2e-3, -4.0]], dtype=torch.bfloat16)  # sigmoids 0.50025 / 0.5005 / 0.018
    bias = torch.tensor([2e-4, 0.0, 0.0])
    w32, i32 = select_experts(logits, 1, scoring="sigmoid", correction_bias=bias)
    w16, i16 = select_experts(logits, 1, scoring="sigmoid", correction_bias=bias, score_in_logits_dtype=True)
    assert i32.tolist() == [[1]]  # fp32: 0.5005 beats 0.50025 + 0.0002
    assert i16.tolist() == [[0]]  # bf16: both round to 0.5, and the bias picks expert 0
    assert w16.dtype == w32.dtype == torch.float32
    with pytest.raises(ValueError, match="score_in_logits_dtype do not apply"):
        select_experts(logits, 2, score_in_logits_dtype=True, custom_routing_function=lambda *a: None)


def test_grouped_topk_deepseek_v2_ranks_groups_by_their_best_score_not_their_sum():
    """Group 0 holds the single best expert, group 1 the larger total: DeepSeek-V2 keeps group 0."""
    p = torch.tensor([[0.45, 0.01, 0.27, 0.27]])
    w, ids = select_experts(p.log(), 2, num_expert_group=2, topk_group=1, renormalize=False)
    assert sorted(ids[0].tolist()) == [0, 1]
    torch.testing.assert_close(w[0], p[0, [0, 1]] / p.sum())


def test_grouped_topk_deepseek_v3_ranks_groups_by_their_two_best_biased_scores():
    """Biased scores [1.4, 0.5 | 1.1, 1.1]: group 0 has the best single expert, group 1 the best pair, and
    DeepSeek-V3 keeps group 1 (top-2 sum 2.2 against 1.9); weights come from the unbiased sigmoids."""
    logits = torch.zeros(1, 4)
    bias = torch.tensor([0.9, 0.0, 0.6, 0.6])
    w, ids = select_experts(logits, 2, scoring="sigmoid", num_expert_group=2, topk_group=1, correction_bias=bias)
    assert sorted(ids[0].tolist()) == [2, 3]
    torch.testing.assert_close(w[0], torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("factor", [0.5, 2.5])
def test_routed_scaling_factor_below_and_above_one(factor):
    logits = torch.randn(5, 8)
    w, ids = select_experts(logits, 2, routed_scaling_factor=factor)
    w1, ids1 = select_experts(logits, 2)
    assert torch.equal(ids, ids1)
    torch.testing.assert_close(w, w1 * factor)
    torch.testing.assert_close(w.sum(-1), torch.full((5,), factor))


def test_grouped_topk_bounds_on_topk_group():
    """topk_group past the number of groups is named (not torch's topk error); top_k that exactly fills the kept
    groups is allowed and takes every expert of them."""
    logits = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"topk_group must be in \[1, num_expert_group=4\], got 5"):
        select_experts(logits, 2, num_expert_group=4, topk_group=5)
    w, ids = select_experts(logits, 4, num_expert_group=4, topk_group=2)
    groups = ids.long() // 2
    for row in groups:
        assert sorted(row.tolist()) == sorted(2 * sorted(set(row.tolist())))  # two whole groups of two
