"""The book's decode workloads: Llama models from a `transformers` config, random weights.

No downloads: the weights are drawn from a seeded generator on the device they run on, so
a machine builds the same model every time. The speed of a decode step depends on the
shapes, not on the values. `CONFIGS` holds every model the book runs:

- "tiny" (4 layers, hidden 256, 19.5 M parameters): so small that a decode step is a string
  of microsecond kernels and launching them sets the speed, with or without a KV cache;
- "small" (8 layers, hidden 1024, 168 M parameters): Chapters 2 and 3's workload, large
  enough that recomputing a long prompt costs far more than launching a cached step;
- "1b" (the shape of Llama-3.2-1B: 1.24 B parameters, 2.47 GB in BF16): Chapters 4 and 5;
- "toy" and "reduced": the small and the 1B structure shrunk for a CPU (smoke mode, tests).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from gpuinfer.model.checkpoint import (check_config_file, check_device, check_safetensors,
                                        check_weights, readable, same_device)

_TINY = dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
             tie_word_embeddings=False)
_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
           num_attention_heads=32, num_key_value_heads=8, head_dim=64,
           max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
           tie_word_embeddings=True)

CONFIGS: dict[str, dict] = {
    "tiny": _TINY,
    "small": {**_TINY, "hidden_size": 1024, "intermediate_size": 2816,
              "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 8192},
    # Chapters 2 and 3 on a CPU: 2 layers, hidden 64.
    "toy": {**_TINY, "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 172,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4},
    "1b": _1B,
    # The 1B structure (grouped-query attention 4/2, tied embeddings) small enough for a
    # CPU: 155,968 parameters. The weights are drawn with a larger standard deviation than
    # the 1B model's 0.02 (0.113 = 0.02 x sqrt(2048 / 64)), so that activations have the 1B
    # model's magnitudes: with 0.02 at this width the layers barely perturb the tied
    # embedding of the input token, and greedy decoding repeats one token forever.
    "reduced": {**_1B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "max_position_embeddings": 1024, "initializer_range": 0.113},
}


def model_config(name: str, **overrides) -> LlamaConfig:
    """The config `CONFIGS[name]`, with `overrides` applied (any LlamaConfig field)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; one of {', '.join(CONFIGS)}")
    return LlamaConfig(**{**CONFIGS[name], **overrides})


def head_dim(config: LlamaConfig) -> int:
    """Features per attention head: the config's own, or hidden / heads where it has none."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Implemented:
    """What `model.llama.forward` implements, and so what the decoders accept.

    The activation: SiLU ("swish" is transformers' other name for it). The rotary
    embedding: every slot's cos and sin come from one table that the model's own rotary
    module computes up front (`llama.rotary_table`), exact for the scalings whose table
    does not depend on the sequence length. "dynamic" and "longrope" rescale it by the
    length; the others ("yarn", ...) are not checked against transformers' tokens here.
    (A class, not module constants: a change here stales only the chapters whose code
    reaches the checks, not every one that imports this module.)"""

    ACTIVATIONS = ("silu", "swish")
    ROPE_TYPES = ("default", "linear", "llama3")
    INSTEAD = "use transformers' generate() for it"


def rope_type(config) -> str:
    """The rotary scaling of `config`: transformers 5's `rope_parameters`, or an older
    config's `rope_scaling`, its type spelled `rope_type` or `type`; "default" if none."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling",
                                                                 None) or {}
    if any(isinstance(v, dict) for v in params.values()):  # one per layer type: not Llama
        raise NotImplementedError(
            f"rope_parameters per layer type ({', '.join(map(str, params))}): the decoders "
            f"use one rotary table for every layer; {Implemented.INSTEAD}")
    return params.get("rope_type") or params.get("type") or "default"


def check_llama(config) -> None:
    """Refuse, with what to do instead, a model the book's decoders do not cover: another
    architecture than Llama's, or a Llama whose math `model.llama.forward` does not do
    (biases, another activation than SiLU, a rotary scaling other than
    `Implemented.ROPE_TYPES`, heads that do not fit its widths).

    What `forward` need not refuse: `rms_norm_eps` and `tie_word_embeddings` are honoured
    (the eps is read, lm_head is the model's own tensor, the embedding when tied);
    `pretraining_tp` changes nothing in transformers 5's forward; `attention_dropout` acts
    only in training, and the decoders do inference."""
    kind = getattr(config, "model_type", None)
    if kind != "llama":
        raise NotImplementedError(
            f"the book's decoders cover Llama models (model_type 'llama'), not {kind!r}: "
            "load a Llama checkpoint (Llama 2, 3, 3.1, 3.2, TinyLlama, SmolLM ...)")
    biased = [n for n in ("attention_bias", "mlp_bias") if getattr(config, n, False)]
    if biased:
        raise NotImplementedError(
            f"this Llama has {' and '.join(biased)}=True; the decoders' projections have "
            f"no bias terms: {Implemented.INSTEAD}")
    act = getattr(config, "hidden_act", "silu")
    if act not in Implemented.ACTIVATIONS:
        raise NotImplementedError(
            f"hidden_act={act!r}: the decoders' MLP computes SiLU(gate) * up (hidden_act "
            f"'silu'); {Implemented.INSTEAD}")
    rope, taken = rope_type(config), Implemented.ROPE_TYPES
    if rope not in taken:
        raise NotImplementedError(
            f"rope_parameters rope_type={rope!r}: the decoders take each slot's rotary "
            f"angle from one table computed up front, exact for {', '.join(taken)} only; "
            f"{Implemented.INSTEAD}")
    check_sizes(config)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv_heads}: grouped-query attention shares "
                         "each key/value head by a whole group; fix the config")
    if not getattr(config, "head_dim", None) and config.hidden_size % heads:
        raise ValueError(f"head_dim=None and hidden_size={config.hidden_size} is not a "
                         f"multiple of num_attention_heads={heads}: set head_dim in the "
                         "config to the width of the checkpoint's heads")


# The config's sizes the decoders read: each a whole number of at least one.
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "max_position_embeddings")


def check_sizes(config) -> None:
    """Refuse a size that is not an int >= 1 (`SIZES`, and head_dim where set) or an
    rms_norm_eps that is not a finite number > 0: transformers builds such a model, and
    the decoders would divide by zero or decode nonsense."""
    sizes = [(n, getattr(config, n, None)) for n in SIZES]
    if getattr(config, "head_dim", None) is not None:
        sizes.append(("head_dim", config.head_dim))
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} in the model's config: a size, an int "
                             ">= 1; fix the config (or use the one that came with the "
                             "weights)")
    eps = getattr(config, "rms_norm_eps", None)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise ValueError(f"rms_norm_eps={eps!r} in the model's config: a number > 0 "
                         "(Llama's 1e-5 or 1e-6); fix the config")


def check_modules(model: LlamaForCausalLM) -> None:
    """Refuse a model whose modules do not compute what its config says, where the
    decoders read the config (a config changed after the model was built): transformers
    runs the modules, the decoders the config's heads, widths, layers and rotary table."""
    cfg = model.config
    d, heads, kv_heads = head_dim(cfg), cfg.num_attention_heads, cfg.num_key_value_heads
    layers = model.model.layers
    if len(layers) != cfg.num_hidden_layers:
        raise ValueError(f"num_hidden_layers={cfg.num_hidden_layers} but the model has "
                         f"{len(layers)} layers (transformers runs the first "
                         f"num_hidden_layers); build the model from its config")
    rope = getattr(model.model.rotary_emb, "rope_type", "default")  # it makes the table
    if rope not in Implemented.ROPE_TYPES:
        raise NotImplementedError(
            f"the model's rotary module has rope_type={rope!r}; the decoders implement "
            f"{', '.join(Implemented.ROPE_TYPES)}; {Implemented.INSTEAD}")
    from transformers.activations import ACT2FN  # the modules each name makes

    silu = tuple({type(ACT2FN[name]) for name in Implemented.ACTIVATIONS})
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        expected = {"q_proj": (heads * d, cfg.hidden_size),
                    "k_proj": (kv_heads * d, cfg.hidden_size),
                    "v_proj": (kv_heads * d, cfg.hidden_size),
                    "o_proj": (cfg.hidden_size, heads * d)}
        for name, shape in expected.items():
            if tuple(getattr(attn, name).weight.shape) != shape:
                raise ValueError(
                    f"head_dim={d} (num_attention_heads={heads}, num_key_value_heads="
                    f"{kv_heads}) does not fit layer {i}'s {name}: "
                    f"{tuple(getattr(attn, name).weight.shape)}, not {shape}; "
                    "use the config that came with these weights")
        if getattr(attn, "head_dim", d) != d:
            raise ValueError(f"head_dim={d} but layer {i}'s attention splits its heads "
                             f"{attn.head_dim} wide (self_attn.head_dim); use the config "
                             "that came with these weights")
        linears = [getattr(attn, n) for n in expected] + [
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
        if any(m.bias is not None for m in linears) or not isinstance(layer.mlp.act_fn, silu):
            raise NotImplementedError(
                f"layer {i} has biases or an activation other than SiLU "
                f"({type(layer.mlp.act_fn).__name__}) that its config does not say; "
                f"{Implemented.INSTEAD}")


def load_llama(source, *, dtype: torch.dtype = torch.bfloat16,
               device: torch.device | str | None = None,
               attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A Llama to decode: `source` is a `LlamaForCausalLM` (returned as it is, checked:
    on `device` if one is given) or the path of a local checkpoint folder
    (`save_pretrained`'s), loaded in `dtype` on `device` (default the CPU), in eval mode.
    Nothing is downloaded. A folder is loaded strictly: a tensor missing (which
    transformers would fill at random), unexpected or of another shape than its config's
    is refused, and so is a damaged file (`model.checkpoint`). Either way a weight that is
    not a finite floating-point number is refused, by name."""
    asked = None if device is None else check_device(device)  # before any load
    if isinstance(source, LlamaForCausalLM):
        check_llama(source.config)
        check_modules(source)
        where = source.lm_head.weight.device
        if asked is not None and not same_device(where, asked):
            raise ValueError(f"device={device!r} but the model's weights are on {where}: "
                             f"move the model there first (model.to({str(asked)!r})), or "
                             "leave device out")
        check_weights(source)
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"load_llama takes a LlamaForCausalLM or a checkpoint folder, not "
                        f"{type(source).__name__}")
    folder = Path(source)
    if not readable(folder) or not readable(folder / "config.json"):
        raise FileNotFoundError(f"{folder}: no config.json there; give the folder that "
                                "save_pretrained() wrote (config.json and the weights)")
    check_config_file(folder / "config.json")
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    check_llama(config)
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    for file in files:
        if readable(file) and file.suffix == ".safetensors":
            check_safetensors(file)
    if not files:
        raise FileNotFoundError(f"{folder}: no weights there (*.safetensors or *.bin); give "
                                "the folder that save_pretrained() wrote")
    # ignore_mismatched_sizes: a tensor of the wrong shape is reported with the others
    # below, not raised by transformers as a RuntimeError that points at its log.
    model, info = LlamaForCausalLM.from_pretrained(
        folder, dtype=dtype, local_files_only=True, attn_implementation=attn_implementation,
        output_loading_info=True, ignore_mismatched_sizes=True)
    check_loaded(folder, config, info)
    check_modules(model)
    model = model.to(asked or "cpu").eval()
    check_weights(model)
    return model


def check_loaded(folder: Path, config, info: dict) -> None:
    """Refuse a checkpoint whose tensors are not exactly its config's model's: transformers'
    loading report `info` (missing, unexpected and mismatched keys, in 5.17 as in 5.25)
    must be empty, except lm_head when the embeddings are tied (it is the embedding)."""
    tied = getattr(config, "tie_word_embeddings", False)
    shapes = {m[0]: f"{m[0]}: {tuple(m[1])} saved, {tuple(m[2])} by the config"
              for m in info.get("mismatched_keys", ())}
    problems = {
        "missing": sorted(k for k in info.get("missing_keys", ())
                          if not (tied and k == "lm_head.weight")),
        "unexpected": sorted(info.get("unexpected_keys", ())),
        "of another shape than the config's": [shapes[k] for k in sorted(shapes)]}
    found = [f"{len(keys)} tensor{'s' * (len(keys) > 1)} {what} ({', '.join(keys[:3])}"
             f"{', ...' if len(keys) > 3 else ''})" for what, keys in problems.items() if keys]
    if any("self_attn" in k for k in shapes):  # the heads' widths, from the config
        found.append(f"the config's head_dim={head_dim(config)}, num_attention_heads="
                     f"{config.num_attention_heads}, num_key_value_heads="
                     f"{config.num_key_value_heads} do not fit the saved projections")
    if found:
        raise ValueError(f"{folder}: the checkpoint does not match its config.json: "
                         f"{'; '.join(found)}; transformers would fill such tensors at "
                         "random: give the folder save_pretrained() wrote, with its own "
                         "config.json")


def build_model(config: LlamaConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu",
                attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A LlamaForCausalLM with seeded random weights, created directly on `device`, in eval
    mode. Creating the modules inside a `torch.device` context allocates and initialises
    every weight on the device: a second on a GPU for 1.2 B parameters, against a minute
    or more initialised on the CPU and copied over."""
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval()


def random_prompt(config: LlamaConfig, length: int, *, batch: int = 1, seed: int = 1,
                  device="cpu") -> torch.Tensor:
    """A seeded random prompt of token ids, shape (batch, length)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen)
    return ids.to(device)
