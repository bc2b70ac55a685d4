"""Task metrics for embedding/reranker and mixture-of-experts training: pure tensor functions.

Each function takes tensors and returns 0-d (or 1-d) tensors computed with a handful of
vectorised ops and no ``.item()``, so it can run on the training thread at a logging
step and be handed to ``run.log`` as is: the writer thread reads the numbers.

Conventions for retrieval metrics: ``scores`` is a ``[queries, candidates]`` similarity
matrix (higher is better) and ``positives`` marks the relevant candidates, either as a
boolean mask of the same shape or as a ``[queries]`` tensor of candidate indices. With
``positives=None`` the matrix must be square and the diagonal is the positive
(in-batch negatives). Ties are resolved in favour of the positive: a candidate's rank
is 1 + the number of candidates with a strictly higher score.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    import torch

    return torch


def _check_matrix(name: str, value: Any) -> None:
    torch = _torch()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"flightlog: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != 2:
        raise ValueError(f"flightlog: {name} must be a 2-d [queries, candidates] tensor, got shape {tuple(value.shape)}")


def positive_mask(scores: "torch.Tensor", positives: Any = None) -> "torch.Tensor":
    """The boolean ``[queries, candidates]`` mask of relevant candidates."""
    torch = _torch()
    _check_matrix("scores", scores)
    q, c = scores.shape
    if positives is None:
        if q != c:
            raise ValueError(
                f"flightlog: positives=None means in-batch negatives with positives on the diagonal, "
                f"which needs a square scores matrix; got shape {(q, c)}"
            )
        return torch.eye(q, dtype=torch.bool, device=scores.device)
    if not isinstance(positives, torch.Tensor):
        positives = torch.as_tensor(positives, device=scores.device)
    if positives.dtype == torch.bool:
        if positives.shape != scores.shape:
            raise ValueError(f"flightlog: positives mask has shape {tuple(positives.shape)}, scores has {(q, c)}")
        return positives
    if positives.dim() != 1 or positives.shape[0] != q:
        raise ValueError(
            f"flightlog: positives must be a bool mask of shape {(q, c)} or {q} candidate indices, "
            f"got shape {tuple(positives.shape)}"
        )
    if positives.is_floating_point():
        raise TypeError("flightlog: positive indices must be integers")
    mask = torch.zeros((q, c), dtype=torch.bool, device=scores.device)
    mask[torch.arange(q, device=scores.device), positives.to(scores.device).long()] = True
    return mask


def cosine_scores(queries: "torch.Tensor", docs: "torch.Tensor") -> "torch.Tensor":
    """Cosine similarity of every query with every document: ``[queries, docs]``."""
    torch = _torch()
    _check_matrix("queries", queries)
    _check_matrix("docs", docs)
    q = torch.nn.functional.normalize(queries.detach().float(), dim=-1)
    d = torch.nn.functional.normalize(docs.detach().float(), dim=-1)
    return q @ d.T


def avg_pos_sim(scores: "torch.Tensor", positives: Any = None) -> "torch.Tensor":
    """Mean score of the relevant (query, candidate) pairs."""
    mask = positive_mask(scores, positives)
    return scores.detach().float()[mask].mean()


def avg_neg_sim(scores: "torch.Tensor", positives: Any = None) -> "torch.Tensor":
    """Mean score of the irrelevant pairs."""
    mask = positive_mask(scores, positives)
    return scores.detach().float()[~mask].mean()


def hardest_neg_sim(scores: "torch.Tensor", positives: Any = None) -> "torch.Tensor":
    """Mean over queries of the highest-scoring irrelevant candidate (the hardest negative)."""
    mask = positive_mask(scores, positives)
    s = scores.detach().float().masked_fill(mask, float("-inf"))
    return s.max(dim=1).values.mean()


def _ranks(scores: "torch.Tensor") -> "torch.Tensor":
    """1 + how many candidates of the same query score strictly higher (ties favour the candidate)."""
    s = scores.detach().float()
    return 1 + (s.unsqueeze(1) > s.unsqueeze(2)).sum(dim=2)


def mrr_at_k(scores: "torch.Tensor", positives: Any = None, k: int = 10) -> "torch.Tensor":
    """Mean reciprocal rank of the first relevant candidate, 0 when it ranks below ``k``."""
    torch = _torch()
    _check_k(k)
    mask = positive_mask(scores, positives)
    s = scores.detach().float()
    best_pos = s.masked_fill(~mask, float("-inf")).max(dim=1).values
    rank = 1 + (s > best_pos.unsqueeze(1)).sum(dim=1)
    rr = torch.where(rank <= k, 1.0 / rank.float(), torch.zeros_like(best_pos))
    rr = torch.where(mask.any(dim=1), rr, torch.zeros_like(rr))
    return rr.mean()


def recall_at_k(scores: "torch.Tensor", positives: Any = None, k: int = 5) -> "torch.Tensor":
    """Mean over queries of the fraction of relevant candidates ranked within the top ``k``."""
    _check_k(k)
    mask = positive_mask(scores, positives)
    hit = (_ranks(scores) <= k) & mask
    per_query = hit.sum(dim=1).float() / mask.sum(dim=1).clamp(min=1).float()
    return per_query.mean()


def _check_k(k: Any) -> None:
    if type(k) is not int or k < 1:
        raise ValueError(f"flightlog: k must be an integer >= 1, got {k!r}")


def embedding_stats(embeddings: "torch.Tensor", prefix: str) -> dict[str, "torch.Tensor"]:
    """``{prefix}_emb_mean`` (mean of all values) and ``{prefix}_emb_std`` (spread across the batch,
    averaged over dimensions: it falls to 0 when every input maps to the same vector)."""
    _check_matrix(f"{prefix} embeddings", embeddings)
    e = embeddings.detach().float()
    return {f"{prefix}_emb_mean": e.mean(), f"{prefix}_emb_std": e.std(dim=0, unbiased=False).mean()}


def collapse_indicator(embeddings: "torch.Tensor") -> "torch.Tensor":
    """Mean cosine similarity between different rows of a batch: near 1 means the
    representation has collapsed (every input gets the same direction)."""
    torch = _torch()
    _check_matrix("embeddings", embeddings)
    n = embeddings.shape[0]
    if n < 2:
        raise ValueError("flightlog: collapse_indicator needs at least 2 embeddings")
    e = torch.nn.functional.normalize(embeddings.detach().float(), dim=-1)
    sim = e @ e.T
    return (sim.sum() - sim.diagonal().sum()) / (n * (n - 1))


def embedding_metrics(
    queries: "torch.Tensor",
    docs: "torch.Tensor",
    positives: Any = None,
    *,
    mrr_k: Sequence[int] = (10,),
    recall_k: Sequence[int] = (5,),
) -> dict[str, "torch.Tensor"]:
    """All embedding/reranker fields of the seeds (``avg_pos_sim``, ``mrr_10``, ``recall_5``...)
    from query and document embeddings, with cosine similarity as the score."""
    scores = cosine_scores(queries, docs)
    mask = positive_mask(scores, positives)
    out: dict[str, Any] = {
        "avg_pos_sim": avg_pos_sim(scores, mask),
        "avg_neg_sim": avg_neg_sim(scores, mask),
        "hardest_neg_sim": hardest_neg_sim(scores, mask),
    }
    for k in mrr_k:
        out[f"mrr_{k}"] = mrr_at_k(scores, mask, k)
    for k in recall_k:
        out[f"recall_{k}"] = recall_at_k(scores, mask, k)
    out.update(embedding_stats(queries, "query"))
    out.update(embedding_stats(docs, "doc"))
    out["embedding_collapse"] = collapse_indicator(docs)
    return out


# ---------------------------------------------------------------------- MoE
def _router_logits(router_logits: Any) -> "torch.Tensor":
    """``[tokens, experts]``; a tuple/list of per-layer logits (HF ``output_router_logits``) is stacked."""
    torch = _torch()
    if isinstance(router_logits, (tuple, list)):
        if not router_logits:
            raise ValueError("flightlog: router_logits is an empty sequence")
        router_logits = torch.cat([r.reshape(-1, r.shape[-1]) for r in router_logits], dim=0)
    if not isinstance(router_logits, torch.Tensor):
        raise TypeError(f"flightlog: router_logits must be a tensor or a sequence of tensors, got {type(router_logits).__name__}")
    if router_logits.dim() < 2:
        raise ValueError(f"flightlog: router_logits must be [..., experts], got shape {tuple(router_logits.shape)}")
    return router_logits.detach().reshape(-1, router_logits.shape[-1]).float()


def _check_top_k(top_k: Any, experts: int) -> None:
    if type(top_k) is not int or not 1 <= top_k <= experts:
        raise ValueError(f"flightlog: top_k must be an integer between 1 and the number of experts ({experts}), got {top_k!r}")


def expert_load(router_logits: Any, top_k: int = 2) -> "torch.Tensor":
    """Fraction of the token->expert assignments (top-k of the router) that went to each expert; sums to 1."""
    torch = _torch()
    logits = _router_logits(router_logits)
    _check_top_k(top_k, logits.shape[1])
    chosen = logits.topk(top_k, dim=1).indices.reshape(-1)
    counts = torch.bincount(chosen, minlength=logits.shape[1]).float()
    return counts / counts.sum()


def gini(values: "torch.Tensor") -> "torch.Tensor":
    """Gini coefficient of non-negative values: 0 when all equal, (n-1)/n when one holds everything."""
    v = values.detach().float().reshape(-1)
    n = v.numel()
    total = v.sum()
    diff = (v.unsqueeze(0) - v.unsqueeze(1)).abs().sum()
    return diff / (2 * n * total.clamp(min=1e-12))


def expert_load_gini(router_logits: Any, top_k: int = 2) -> "torch.Tensor":
    """Gini coefficient of the per-expert load (0 = perfectly balanced)."""
    return gini(expert_load(router_logits, top_k))


def router_z_loss(router_logits: Any) -> "torch.Tensor":
    """ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2 (large = over-confident router)."""
    logits = _router_logits(router_logits)
    return (logits.logsumexp(dim=1) ** 2).mean()


def experts_fired_per_token(router_logits: Any, top_k: int = 2, threshold: float = 0.0) -> "torch.Tensor":
    """Mean number of experts per token among its top-k whose routing probability exceeds ``threshold``
    (with ``threshold=0`` this is ``top_k``; routers that prune weak experts fire fewer)."""
    logits = _router_logits(router_logits)
    _check_top_k(top_k, logits.shape[1])
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold < 1.0:
        raise ValueError(f"flightlog: threshold must be a probability in [0, 1), got {threshold!r}")
    probs = logits.softmax(dim=1).topk(top_k, dim=1).values
    return (probs > threshold).sum(dim=1).float().mean()


def moe_metrics(router_logits: Any, top_k: int = 2, threshold: float = 0.0) -> dict[str, "torch.Tensor"]:
    """The seeds' MoE fields from router logits: gini, z-loss, experts per token, per-expert load."""
    logits = _router_logits(router_logits)
    load = expert_load(logits, top_k)
    return {
        "expert_load_gini": gini(load),
        "router_z_loss": router_z_loss(logits),
        "experts_fired_per_token": experts_fired_per_token(logits, top_k, threshold),
        "expert_load": load,
    }
