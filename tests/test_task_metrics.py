"""Task metrics against values worked out by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from flightlog.collect import task_metrics as tm

# 3 queries x 4 candidates; positives: q0->c0, q1->c2, q2->c1 and c3.
SCORES = torch.tensor(
    [
        [0.9, 0.2, 0.5, 0.1],
        [0.3, 0.8, 0.7, 0.4],
        [0.6, 0.5, 0.2, 0.7],
    ]
)
MASK = torch.tensor(
    [
        [True, False, False, False],
        [False, False, True, False],
        [False, True, False, True],
    ]
)


def close(value: torch.Tensor, expected: float) -> bool:
    return value.dim() == 0 and math.isclose(float(value), expected, rel_tol=1e-6, abs_tol=1e-7)


class TestRetrieval:
    def test_avg_pos_sim(self) -> None:
        """Mean over the 4 positive pairs: (0.9 + 0.7 + 0.5 + 0.7) / 4."""
        assert close(tm.avg_pos_sim(SCORES, MASK), 2.8 / 4)

    def test_avg_neg_sim(self) -> None:
        """Mean over the 8 negative pairs."""
        assert close(tm.avg_neg_sim(SCORES, MASK), (0.2 + 0.5 + 0.1 + 0.3 + 0.8 + 0.4 + 0.6 + 0.2) / 8)

    def test_hardest_neg_sim(self) -> None:
        """Per query the largest negative: 0.5, 0.8, 0.6."""
        assert close(tm.hardest_neg_sim(SCORES, MASK), (0.5 + 0.8 + 0.6) / 3)

    def test_mrr(self) -> None:
        """First relevant ranks: q0 1, q1 2 (0.8 beats 0.7), q2 1 (0.7 is the top) -> (1 + 1/2 + 1) / 3."""
        assert close(tm.mrr_at_k(SCORES, MASK, k=10), 2.5 / 3)
        # With k=1 the rank-2 hit no longer counts.
        assert close(tm.mrr_at_k(SCORES, MASK, k=1), 2 / 3)

    def test_recall(self) -> None:
        """recall@1: q0 1/1, q1 0/1, q2 1/2; recall@2: q0 1, q1 1, q2 1/2 (c1 ranks 3rd)."""
        assert close(tm.recall_at_k(SCORES, MASK, k=1), (1 + 0 + 0.5) / 3)
        assert close(tm.recall_at_k(SCORES, MASK, k=2), (1 + 1 + 0.5) / 3)
        assert close(tm.recall_at_k(SCORES, MASK, k=4), 1.0)

    def test_index_positives_and_diagonal(self) -> None:
        """Positives as indices equal the mask; None means the diagonal of a square matrix."""
        idx = torch.tensor([0, 2, 3])
        mask = tm.positive_mask(SCORES, idx)
        assert mask.tolist() == [[True, False, False, False], [False, False, True, False], [False, False, False, True]]
        square = torch.tensor([[0.9, 0.1], [0.8, 0.2]])
        assert close(tm.avg_pos_sim(square), (0.9 + 0.2) / 2)
        assert close(tm.mrr_at_k(square), (1 + 0.5) / 2)

    def test_ties_favour_the_positive(self) -> None:
        """A negative with the same score as the positive does not push it down."""
        s = torch.tensor([[0.5, 0.5]])
        assert close(tm.mrr_at_k(s, torch.tensor([1]), k=1), 1.0)

    def test_bad_inputs_are_named(self) -> None:
        with pytest.raises(ValueError, match="square"):
            tm.avg_pos_sim(SCORES)
        with pytest.raises(ValueError, match="k must be"):
            tm.mrr_at_k(SCORES, MASK, k=0)
        with pytest.raises(ValueError, match="positives"):
            tm.recall_at_k(SCORES, torch.tensor([0, 1]))
        with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
            tm.avg_neg_sim([[1.0]], None)


class TestEmbeddings:
    def test_stats(self) -> None:
        """Mean of all values; std per dimension across the batch, averaged."""
        e = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
        stats = tm.embedding_stats(e, "query")
        assert close(stats["query_emb_mean"], 2.0)
        assert close(stats["query_emb_std"], (1.0 + 2.0) / 2)

    def test_collapse(self) -> None:
        """Identical directions read 1; orthogonal ones 0; opposite pairs -1."""
        assert close(tm.collapse_indicator(torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0]])), 1.0)
        assert close(tm.collapse_indicator(torch.eye(3)), 0.0)
        assert close(tm.collapse_indicator(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])), -1.0)

    def test_embedding_metrics_use_cosine(self) -> None:
        """Cosine scores of q=[1,0],[0,1] and d=[1,0],[1,1]: [[1, .7071], [0, .7071]]."""
        q = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
        d = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
        out = tm.embedding_metrics(q, d, recall_k=(1, 5))
        r = 1 / math.sqrt(2)
        assert close(out["avg_pos_sim"], (1 + r) / 2)
        assert close(out["avg_neg_sim"], (r + 0) / 2)
        assert close(out["hardest_neg_sim"], (r + 0) / 2)
        assert close(out["mrr_10"], 1.0)
        assert close(out["recall_1"], 1.0)
        assert set(out) >= {"query_emb_mean", "query_emb_std", "doc_emb_mean", "doc_emb_std", "embedding_collapse", "recall_5"}


class TestMoE:
    # 4 tokens, 3 experts; top-1 choices: 0, 0, 1, 0; top-2 pairs {0,1} {0,2} {1,2} {0,2}.
    LOGITS = torch.tensor(
        [
            [2.0, 1.0, 0.0],
            [3.0, 0.0, 1.0],
            [0.0, 2.0, 1.0],
            [1.0, 0.0, 0.5],
        ]
    )

    def test_load(self) -> None:
        assert tm.expert_load(self.LOGITS, top_k=1).tolist() == [0.75, 0.25, 0.0]
        assert tm.expert_load(self.LOGITS, top_k=2).tolist() == pytest.approx([3 / 8, 2 / 8, 3 / 8])

    def test_gini(self) -> None:
        """Loads .75/.25/0: sum |xi-xj| over ordered pairs = 2*(.5+.75+.25) = 3, / (2*3*1) = 0.5."""
        assert close(tm.expert_load_gini(self.LOGITS, top_k=1), 0.5)
        assert close(tm.gini(torch.ones(4)), 0.0)
        assert close(tm.gini(torch.tensor([0.0, 0.0, 0.0, 1.0])), 3 / 4)

    def test_z_loss(self) -> None:
        expected = sum(math.log(sum(math.exp(x) for x in row)) ** 2 for row in self.LOGITS.tolist()) / 4
        assert close(tm.router_z_loss(self.LOGITS), expected)

    def test_experts_fired(self) -> None:
        """Top-2 always fires 2 at threshold 0; at 0.2 the weak second choices drop out."""
        assert close(tm.experts_fired_per_token(self.LOGITS, top_k=2), 2.0)
        probs = self.LOGITS.softmax(dim=1).topk(2, dim=1).values
        expected = float((probs > 0.2).sum()) / 4
        assert close(tm.experts_fired_per_token(self.LOGITS, top_k=2, threshold=0.2), expected)
        assert expected < 2.0

    def test_layers_are_stacked(self) -> None:
        """A tuple of per-layer [batch, seq, experts] logits counts every token of every layer."""
        layers = (self.LOGITS.reshape(2, 2, 3), self.LOGITS)
        assert tm.expert_load(layers, top_k=1).tolist() == [0.75, 0.25, 0.0]
        out = tm.moe_metrics(layers, top_k=1)
        assert set(out) == {"expert_load_gini", "router_z_loss", "experts_fired_per_token", "expert_load"}

    def test_bad_inputs(self) -> None:
        with pytest.raises(ValueError, match="top_k"):
            tm.expert_load(self.LOGITS, top_k=4)
        with pytest.raises(ValueError, match="threshold"):
            tm.experts_fired_per_token(self.LOGITS, threshold=1.5)
        with pytest.raises(TypeError, match="router_logits"):
            tm.router_z_loss("logits")
