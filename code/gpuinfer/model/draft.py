"""A draft cut from its target, for speculative decoding.

A draft trained from random weights must first learn what the target already knows: a
vector for every token, and the space its LM head reads. A draft of the target's width
can start with the target's own: its embedding (which, tied, is also its LM head), its
final norm and a few of its layers. The layers kept are the first ones and the last, the
one whose output the final norm and the head read, so the untrained draft already
speaks the target's language, if badly. Distillation (`train.train(teacher=...)`) then
teaches those few layers to stand in for all of them, while the token vectors stay the
target's. Self-speculative decoding skips the target's middle layers as they are
(LayerSkip, Draft & Verify); here they are where the training starts.
"""

from __future__ import annotations

import torch

SHAPE = ("hidden_size", "intermediate_size", "num_attention_heads",
         "num_key_value_heads", "vocab_size", "tie_word_embeddings")


def kept_layers(target_layers: int, draft_layers: int) -> list[int]:
    """The target's layers a draft of `draft_layers` starts from: the first
    draft_layers - 1 and the last."""
    if not 1 <= draft_layers <= target_layers:
        raise ValueError(f"a draft of {draft_layers} layers from a target of "
                         f"{target_layers}: give it between 1 and {target_layers}")
    return [*range(draft_layers - 1), target_layers - 1]


def start_from(draft, target, layers: list[int] | None = None) -> list[int]:
    """Copy into `draft` the target's embedding, final norm and `layers` (default:
    `kept_layers`), one into each of the draft's layers in order, and freeze the
    embedding (the tied LM head with it), so that training moves only the draft's
    layers and norm. Both are `transformers` Llamas with tied embeddings, of one shape
    but for their layer counts. Returns the target's layers copied. Everything is
    checked before a weight is written."""
    if draft is target:
        raise ValueError("the draft is the target itself: build a model of fewer "
                         "layers and start it from the target")
    dc, tc = draft.config, target.config
    for name in SHAPE:
        if getattr(dc, name, None) != getattr(tc, name, None):
            raise ValueError(f"the draft's {name} is {getattr(dc, name, None)}, the "
                             f"target's {getattr(tc, name, None)}: a draft starts from "
                             f"the target's weights only at the target's {name}")
    n_draft, n_target = dc.num_hidden_layers, tc.num_hidden_layers
    layers = kept_layers(n_target, n_draft) if layers is None else list(layers)
    if len(layers) != n_draft or not all(
            isinstance(i, int) and 0 <= i < n_target for i in layers):
        raise ValueError(f"layers={layers}: {n_draft} indices of the target's "
                         f"{n_target} layers, one for each of the draft's")
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
        for mine, i in zip(draft.model.layers, layers):
            mine.load_state_dict(target.model.layers[i].state_dict())
    draft.model.embed_tokens.weight.requires_grad_(False)
    return layers
