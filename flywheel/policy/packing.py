"""Prefix-tree packing: the answers of many prompts trained in one sequence, each seeing exactly its own prompt.

The per-step SFT set repeats itself: step t's prompt is the system message, the task and the fused history
up to t, so a trajectory of T steps computes its system message T times and its early history up to T-1
times (ReAct is worse: step t+1's prompt is step t's prompt plus its answer). Packing computes every
distinct prefix once.

Each example is tokenized exactly as TRL's SFTTrainer tokenizes a conversational prompt/completion row
(`example_ids`). The token sequences of a group of examples are inserted into a prefix tree (a trie of
token ids): a token shared by several examples' prefixes is one node. The tree is laid out as one
sequence in insertion order (a parent always precedes its children), and

- every token attends to its ancestors and itself, and to nothing else (`ancestor_mask`): a step's own
  tail (the latest observation unclipped, the "respond" line, its answer with the long thought e_t)
  is a branch that no later step sees, as long-short fusion requires;
- every token's position id is its depth in the tree: the position it has in its own example;
- every answer token is predicted from the node of the token before it in its own example (`targets`).

So each answer's logits are computed from exactly the inputs its per-step prompt gives, at the same
positions: the per-token log-probabilities are the per-step formulation's, up to float rounding
(tests/policy/test_packing.py checks 1e-4 and the gradient's cosine). Where two examples need the same
node's logits for different next tokens (two answers after one prompt), both targets are kept.

Packs are bounded by a token budget (`max_tokens`, the SFT's `max_length`): the examples of a group are
added in order and a new pack starts (with its own copy of the shared trunk) when the next example would
not fit, so an answer is never cut and a long trajectory is split at step boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# How SFT, DPO and GRPO compute a trajectory's answers: "tree" packs them (this module), "per_step" gives each
# answer its own padded sequence (SFT) or scores the trajectory as one transcript (DPO, GRPO).
PACKINGS = ("tree", "per_step")
DEFAULT_PACKING = "tree"


def example_ids(tok, row: dict) -> tuple[list[int], int]:
    """(token ids of the whole example, index of its first answer token): TRL SFTTrainer's tokenization of a
    conversational prompt/completion row (the prompt with the generation prompt; the answer starts where the
    prompt's ids and the whole example's ids first differ)."""
    prompt = _chat_ids(tok, row["prompt"], generation_prompt=True)
    full = _chat_ids(tok, row["prompt"] + row["completion"])
    start = 0
    for a, b in zip(prompt, full, strict=False):
        if a != b:
            break
        start += 1
    return full, start


def _chat_ids(tok, messages: list[dict], *, generation_prompt: bool = False) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=True)
    return list(out["input_ids"])


@dataclass
class Pack:
    """One packed sequence: a prefix tree of token ids laid out in insertion order.

    `parents[i]` is the index of token i's parent (-1 for a root); `position_ids[i]` its depth. The targets
    are parallel lists: the logits at `sources[j]` predict `labels[j]`, a token of example `examples[j]`
    (its index in the list the pack was built from)."""

    input_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    _children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.input_ids)

    def new_tokens(self, ids: Sequence[int]) -> int:
        """How many tokens adding `ids` would add (its length less the prefix already in the tree)."""
        node, shared = -1, 0
        for token in ids:
            node = self._children.get((node, token), None)
            if node is None:
                break
            shared += 1
        return len(ids) - shared

    def add(self, ids: Sequence[int], answer_start: int, example: int) -> None:
        """Insert one example: its tokens become (or reuse) nodes; its answer tokens become targets."""
        node = -1
        path = []
        for token in ids:
            child = self._children.get((node, token))
            if child is None:
                child = len(self.input_ids)
                self._children[(node, token)] = child
                self.input_ids.append(token)
                self.parents.append(node)
                self.position_ids.append(0 if node < 0 else self.position_ids[node] + 1)
            path.append(child)
            node = child
        for j in range(max(answer_start, 1), len(ids)):
            self.sources.append(path[j - 1])
            self.labels.append(ids[j])
            self.examples.append(example)


# An example joins the current pack only when the pack already holds at least this share of its tokens. The
# system message alone is 24-59% of an example on the presets' k=0 sets (median share 36-82%), so related examples
# still pack; unrelated ones get packs of their own, and a pack never holds more activations than sharing pays for.
MIN_SHARED = 0.2


def pack(tokenized: Sequence[tuple[Sequence[int], int]], max_tokens: int) -> list[Pack]:
    """Packs of at most `max_tokens` tokens holding `tokenized` ((ids, answer start) per example), in order: an
    example starts a new pack when it would not fit, or when the current pack shares less than `MIN_SHARED` of it.

    An example longer than `max_tokens` is an error (SFT drops those before packing, never truncates)."""
    packs = [Pack()]
    for i, (ids, start) in enumerate(tokenized):
        if len(ids) > max_tokens:
            raise ValueError(f"example {i} has {len(ids)} tokens, more than the pack budget of {max_tokens}")
        new = packs[-1].new_tokens(ids)
        if len(packs[-1]) and (len(packs[-1]) + new > max_tokens or len(ids) - new < MIN_SHARED * len(ids)):
            packs.append(Pack())
        packs[-1].add(ids, start, i)
    return [p for p in packs if len(p)]


def ancestor_mask(parents: Sequence[int]):
    """Boolean (L, L) numpy matrix: [i, j] is True when token j is token i or one of its ancestors."""
    import numpy as np

    n = len(parents)
    mask = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i, :p + 1] = mask[p, :p + 1]  # a parent precedes its children: its row ends at p
        mask[i, i] = True
    return mask


# The segment-wise tree attention (`tree_attention`), registered with transformers under this name; the model's
# forward pass hands each attention call the pack's segments as the keyword argument `tree_segments` (a keyword,
# not global state, so that activation recomputation in the backward pass sees them too).
TREE_ATTENTION = "flywheel_tree"


def packed_attention_implementation() -> str:
    """The attention implementation a model that scores packs runs with: FlexAttention on CUDA (its block mask
    skips whole blocks no token attends to); `tree_attention` elsewhere (the CPU, where a dense tree mask costs
    the whole L x L product: a 4,096-token pack took 11x a 1,024-token sequence's step, and FlexAttention
    compiles for ~20 s per process)."""
    import torch

    if torch.cuda.is_available():
        return "flex_attention"
    register_tree_attention()
    return TREE_ATTENTION


def use_packed_attention(model) -> None:
    """Switch a loaded model (or a PEFT/DDP wrapper of one) to `packed_attention_implementation`."""
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    inner.set_attn_implementation(packed_attention_implementation())


def register_tree_attention() -> None:
    from transformers import AttentionInterface

    if TREE_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(TREE_ATTENTION, tree_attention)


def tree_segments(p: Pack, device=None) -> list[tuple]:
    """The pack cut into segments for `tree_attention`: maximal runs [a, b) of tokens each the child of the one
    before it. A segment's tokens share their ancestors outside it (the path to parent[a]) and attend to those
    and causally within the segment: (a, b, key positions, boolean mask (b - a, keys), or None when causal)."""
    import torch

    segments, start = [], 0
    for i in range(1, len(p.parents) + 1):
        if i == len(p.parents) or p.parents[i] != i - 1:
            path, node = [], p.parents[start]
            while node >= 0:
                path.append(node)
                node = p.parents[node]
            path.reverse()
            n, m = i - start, len(path)
            keys = torch.tensor(path + list(range(start, i)), device=device)
            mask = None
            if m:
                mask = torch.ones(n, m + n, dtype=torch.bool, device=device)
                mask[:, m:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            segments.append((start, i, keys, mask))
            start = i
    return segments


def tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                   tree_segments: list | None = None, **kwargs):
    """Attention over a pack's tree, segment by segment (`tree_segments`, passed by `target_logps`): each
    segment's queries against its ancestors' and its own keys, so no work is spent on pairs the tree mask hides.
    Without segments (an ordinary forward pass) it is transformers' SDPA attention."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    segments = tree_segments
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = (repeat_kv(key, groups), repeat_kv(value, groups)) if groups > 1 else (key, value)
    outs = []
    for a, b, keys, mask in segments:
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b], key.index_select(2, keys), value.index_select(2, keys), attn_mask=mask,
            dropout_p=dropout, scale=scaling, is_causal=mask is None and b - a > 1))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def attention_path(model) -> str:
    """How a pack's tree reaches attention: "tree" (`tree_attention`'s segments, the CPU default), "flex"
    (a FlexAttention block mask: on CUDA, where it skips the masked blocks), "sdpa" (a dense boolean mask) or
    "eager" (an additive float mask)."""
    model = getattr(model, "module", model)  # DDP's wrapper has no config
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl == TREE_ATTENTION:
        return "tree"
    if impl == "flex_attention":
        return "flex"
    return "eager" if impl == "eager" else "sdpa"


def model_inputs(p: Pack, model, device=None) -> dict:
    """The keyword arguments of `model(...)` for one pack: ids, tree positions, the tree mask in the form the
    model's attention implementation takes, and the logits to keep (the targets' sources, deduplicated)."""
    import torch

    device = device or next(model.parameters()).device
    path = attention_path(model)
    keep, rows = torch.unique(torch.tensor(p.sources, device=device), sorted=True, return_inverse=True)
    inputs = {"input_ids": torch.tensor([p.input_ids], device=device),
              "position_ids": torch.tensor([p.position_ids], device=device), "logits_to_keep": keep,
              "use_cache": False, "_rows": rows}
    if path == "tree":  # no mask: the segments carry the tree
        return {**inputs, "attention_mask": None, "tree_segments": tree_segments(p, device)}
    mask = torch.from_numpy(ancestor_mask(p.parents)).to(device)
    if path == "flex":
        attention_mask = flex_block_mask(mask)
    elif path == "eager":
        dtype = next(model.parameters()).dtype
        attention_mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        attention_mask = attention_mask[None, None]
    else:
        attention_mask = mask[None, None]
    return {**inputs, "attention_mask": attention_mask}


def flex_block_mask(mask):
    """The tree mask as a FlexAttention BlockMask (blocks where no token attends are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    n = mask.shape[0]

    def tree(b, h, q, kv):
        return mask[q, kv]

    return create_block_mask(tree, B=None, H=None, Q_LEN=n, KV_LEN=n, device=str(mask.device))


def target_logps(model, p: Pack):
    """log pi(label_j | its example's tokens before it) for every target of pack `p` (float32, in the order of
    `p.labels`), from one forward pass over the pack."""
    import torch

    inputs = model_inputs(p, model)
    rows = inputs.pop("_rows")
    logits = model(**inputs).logits[0]  # (distinct sources, vocabulary)
    labels = torch.tensor(p.labels, device=logits.device)
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps[rows, labels]


def packs_logps(model, packs: Sequence[Pack]):
    """`target_logps` of every pack, concatenated: all answer tokens of what `packs` hold, in order."""
    import torch

    return torch.cat([target_logps(model, p) for p in packs])


def per_step_logps(model, ids: Sequence[int], answer_start: int):
    """The reference: log pi(answer token | prompt and answer before it) of one example, from its own causal
    forward pass (what per-step SFT computes)."""
    import torch

    x = torch.tensor([list(ids)], device=next(model.parameters()).device)
    logits = model(input_ids=x, use_cache=False).logits[0, :-1]
    logps = torch.log_softmax(logits.float(), dim=-1)
    start = max(answer_start, 1)
    return logps[start - 1:, :].gather(1, x[0, start:, None])[:, 0]
