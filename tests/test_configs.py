"""Which Llamas the book's decoders take (model.configs: check_llama, check_modules,
load_llama): a config whose math `model.llama.forward` does not do is refused, from a
model and from a checkpoint folder, with a first line that names the key, its value and
what to do; a folder loads strictly (a tensor missing, unexpected or of another shape is
refused, never filled at random); the rotary scalings the decoders take (default, linear,
llama3) give transformers' own greedy FP32 tokens past the length where they matter.

Without a GPU the Triton decoder runs under Triton's interpreter (a few seconds each)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode import runners  # noqa: E402
from gpuinfer.decode.loops import decode_naive  # noqa: E402
from gpuinfer.decode.static import StaticDecoder  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.model.configs import (build_model, check_llama, load_llama,  # noqa: E402
                                    model_config, random_prompt, rope_type)
from gpuinfer.model.llama import rotary_table  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WEIGHTS = "model.safetensors"

# The scalings the decoders take, each spelled as a checkpoint may spell it: transformers
# 4's `rope_scaling` with "type", transformers 5's `rope_parameters` with "rope_type".
# llama3's original length (64) is short, so that the prompt and the generation run past
# it; linear's factor 4 divides every angle.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
          "rope_theta": 500000.0}
ACCEPTED = {"default": {},
            "linear": {"rope_scaling": {"type": "linear", "factor": 4.0}},
            "llama3": {"rope_parameters": LLAMA3}}
PROMPT, NEW = 24, 48  # 72 positions, past llama3's 64

# Configs whose math the decoders do not do: (overrides, the first line's words).
REFUSED = {
    "gelu": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "relu": ({"hidden_act": "relu"}, "hidden_act='relu'"),
    "dynamic": ({"rope_scaling": {"type": "dynamic", "factor": 2.0}},
                "rope_type='dynamic'"),
    "yarn": ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                  "rope_theta": 500000.0}}, "rope_type='yarn'"),
}


def reduced(seed=0, **overrides):
    """The 1B structure shrunk (heads 4/2, head_dim 16, tied embeddings), FP32."""
    return build_model(model_config("reduced", **overrides), seed=seed, device=DEVICE)


def first_line(exc_info) -> str:
    return str(exc_info.value).splitlines()[0]


@pytest.mark.parametrize("scaling", list(ACCEPTED))
def test_the_rope_scalings_the_decoders_take_give_transformers_tokens(scaling, tmp_path):
    model = reduced(**ACCEPTED[scaling])
    assert rope_type(model.config) == scaling
    prompt = random_prompt(model.config, PROMPT, device=DEVICE)
    reference = decode_naive(model, prompt, NEW)  # the model's own forward, each step
    generated = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW,
                               do_sample=False)
    assert torch.equal(generated[:, PROMPT:].cpu(), reference)
    assert len(set(reference[0].tolist())) > 5  # a test of something: not one token
    if scaling != "default":  # the scaling changes the angles and, here, the tokens
        plain = reduced()
        assert not torch.allclose(rotary_table(model, PROMPT + NEW)[0],
                                  rotary_table(plain, PROMPT + NEW)[0])
        assert not torch.equal(decode_naive(plain, prompt, NEW), reference)
    capacity = PROMPT + NEW
    static = StaticDecoder(model, 1, capacity)
    assert torch.equal(runners.generate(static, prompt, NEW, runners.EAGER), reference)
    assert torch.equal(TritonDecoder(model, capacity=capacity).generate(prompt, NEW),
                       reference)
    model.save_pretrained(tmp_path)  # the scaling survives config.json
    loaded = load_llama(tmp_path, dtype=torch.float32, device=DEVICE)
    assert rope_type(loaded.config) == scaling
    from_folder = StaticDecoder(loaded, 1, capacity)
    assert torch.equal(runners.generate(from_folder, prompt, NEW, runners.EAGER), reference)


@pytest.mark.parametrize("case", list(REFUSED))
def test_configs_the_decoders_do_not_implement_are_refused(case, tmp_path):
    overrides, words = REFUSED[case]
    model = reduced(**overrides)
    for build in (lambda: load_llama(model), lambda: StaticDecoder(model, 1, 16),
                  lambda: TritonDecoder(model, capacity=16)):
        with pytest.raises(NotImplementedError) as exc:
            build()
        assert words in first_line(exc) and "generate()" in first_line(exc)
    model.save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError) as exc:
        load_llama(tmp_path)
    assert words in first_line(exc)
    with pytest.raises(NotImplementedError, match=words.replace("'", ".")):
        StaticDecoder(str(tmp_path), 1, 16)


def test_a_silu_model_is_taken_by_either_name():
    for name in ("silu", "swish"):  # transformers' two names of one function
        check_llama(model_config("reduced", hidden_act=name))


def test_heads_that_do_not_fit_the_widths_are_refused():
    config = model_config("reduced")
    config.num_key_value_heads = 3  # 4 query heads: no whole groups
    with pytest.raises(ValueError, match="num_attention_heads=4 is not a multiple of "
                                         "num_key_value_heads=3"):
        check_llama(config)
    config = model_config("reduced")
    config.head_dim, config.hidden_size = None, 66  # no head_dim: hidden / heads
    with pytest.raises(ValueError, match="head_dim=None and hidden_size=66 .* "
                                         "num_attention_heads=4"):
        check_llama(config)


def test_a_model_whose_config_no_longer_says_what_its_modules_do_is_refused():
    """A config changed after the model was built: transformers runs the modules, the
    decoders would read the config."""
    model = reduced()
    model.config.head_dim = 8  # q_proj has 4 heads of 16 rows
    with pytest.raises(ValueError, match=r"head_dim=8 .* layer 0's q_proj: \(64, 64\)"):
        StaticDecoder(model, 1, 16)
    # 8 heads of 8 fill every projection exactly; the attention still splits by 16.
    model.config.num_attention_heads, model.config.num_key_value_heads = 8, 4
    with pytest.raises(ValueError, match="head_dim=8 but layer 0's attention splits its "
                                         "heads 16 wide"):
        load_llama(model)
    model = reduced()
    model.config.num_hidden_layers = 1  # transformers would run the first layer only
    with pytest.raises(ValueError, match="num_hidden_layers=1 but the model has 2 layers"):
        TritonDecoder(model, capacity=16)
    model = reduced(hidden_act="gelu")
    model.config.hidden_act = "silu"  # the modules still compute GELU
    with pytest.raises(NotImplementedError, match="activation other than SiLU"):
        StaticDecoder(model, 1, 16)
    model = reduced(rope_scaling={"type": "dynamic", "factor": 2.0})
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    with pytest.raises(NotImplementedError, match="rope_type='dynamic'"):
        load_llama(model)  # the rotary module, which makes the table, is dynamic


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two checkpoint folders of the reduced model: tied embeddings (no lm_head tensor
    saved), and untied."""
    root = tmp_path_factory.mktemp("saved")
    reduced().save_pretrained(root / "tied")
    reduced(tie_word_embeddings=False).save_pretrained(root / "untied")
    return root


def broken(saved, tmp_path, edit, which="tied"):
    """A copy of a saved folder with its tensors changed by `edit` (a dict of them)."""
    folder = tmp_path / which
    shutil.copytree(saved / which, folder)
    tensors = load_file(folder / WEIGHTS)
    edit(tensors)
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    return folder


def test_a_complete_folder_loads_and_a_tied_one_needs_no_lm_head(saved):
    for which in ("tied", "untied"):
        model = load_llama(saved / which, dtype=torch.float32)
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        assert tied == (which == "tied") and not model.training
        assert ("lm_head.weight" in load_file(saved / which / WEIGHTS)) == (not tied)


def test_a_config_without_head_dim_takes_hidden_over_heads(saved, tmp_path):
    """An older config.json has no head_dim: the heads are hidden_size / heads wide."""
    folder = tmp_path / "no_head_dim"
    shutil.copytree(saved / "tied", folder)
    config = json.loads((folder / "config.json").read_text())
    del config["head_dim"]  # 64 / 4 = 16, the saved projections' width
    (folder / "config.json").write_text(json.dumps(config))
    model = load_llama(folder, dtype=torch.float32)
    assert model.config.head_dim == 16


def test_a_folder_with_a_tensor_missing_is_refused_not_filled_at_random(saved, tmp_path):
    up = "model.layers.0.mlp.up_proj.weight"
    folder = broken(saved, tmp_path, lambda t: t.pop(up))
    with pytest.raises(ValueError) as exc:
        load_llama(folder)
    assert f"1 tensor missing ({up})" in first_line(exc)
    assert "at random" in first_line(exc)
    with pytest.raises(ValueError, match="1 tensor missing"):
        StaticDecoder(str(folder), 1, 16)
    untied = broken(saved, tmp_path, lambda t: t.pop("lm_head.weight"), "untied")
    with pytest.raises(ValueError, match=r"1 tensor missing \(lm_head.weight\)"):
        load_llama(untied)


def test_a_folder_with_a_whole_layer_missing_names_a_few_and_the_count(saved, tmp_path):
    def drop_layer_1(tensors):
        for key in [k for k in tensors if k.startswith("model.layers.1.")]:
            del tensors[key]
    with pytest.raises(ValueError) as exc:
        load_llama(broken(saved, tmp_path, drop_layer_1))
    line = first_line(exc)
    assert "9 tensors missing (model.layers.1." in line and ", ...)" in line


def test_a_folder_with_a_renamed_tensor_is_refused(saved, tmp_path):
    up = "model.layers.0.mlp.up_proj.weight"
    folder = broken(saved, tmp_path,
                    lambda t: t.__setitem__("model.layers.0.mlp.upp.weight", t.pop(up)))
    with pytest.raises(ValueError) as exc:
        load_llama(folder)
    assert (f"1 tensor missing ({up}); 1 tensor unexpected (model.layers.0.mlp.upp.weight)"
            in first_line(exc))


def test_a_folder_with_a_tensor_of_another_shape_is_refused(saved, tmp_path):
    up = "model.layers.0.mlp.up_proj.weight"
    folder = broken(saved, tmp_path, lambda t: t.__setitem__(up, torch.zeros(250, 64)))
    with pytest.raises(ValueError, match=f"1 tensor of another shape than the config's "
                                         f"\\({up}: \\(250, 64\\) saved, \\(256, 64\\) by"):
        load_llama(folder)
    config = json.loads((saved / "tied" / "config.json").read_text())
    config["head_dim"] = 8  # the config's heads no longer fit the saved projections
    folder = tmp_path / "head_dim"
    shutil.copytree(saved / "tied", folder)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as exc:
        load_llama(folder)
    assert "8 tensors of another shape than the config's (model.layers.0.self_attn" in \
        first_line(exc)
    assert "head_dim=8, num_attention_heads=4, num_key_value_heads=2 do not fit" in \
        first_line(exc)


def test_a_folder_without_weights_is_refused(saved, tmp_path):
    folder = tmp_path / "config_only"
    folder.mkdir()
    shutil.copy(saved / "tied" / "config.json", folder)
    with pytest.raises(FileNotFoundError, match="no weights there"):
        load_llama(folder)


# Damaged checkpoints and nonsense values: one line naming the file or value and the fix
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("num_key_value_heads", 0), ("hidden_size", 0), ("intermediate_size", -1),
    ("num_hidden_layers", 0), ("vocab_size", 0), ("max_position_embeddings", 0),
    ("head_dim", 0), ("rms_norm_eps", 0.0), ("rms_norm_eps", float("nan"))])
def test_nonsense_sizes_in_a_config_are_refused(name, value):
    with pytest.raises(ValueError, match=f"{name}={value!r} in the model's config") as exc:
        check_llama(model_config("reduced", **{name: value}))
    assert "fix the config" in first_line(exc)


def copied(saved, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(saved / "tied", folder)
    return folder


@pytest.mark.parametrize("damage, words", [
    (lambda f: f.write_bytes(b""), "empty"),
    (lambda f: f.write_bytes(f.read_bytes()[:4]), "truncated"),
    (lambda f: f.write_bytes(f.read_bytes()[:1000]), "truncated"),
    (lambda f: f.write_bytes(f.read_bytes()[:-10]), "truncated"),
])
def test_an_empty_or_truncated_safetensors_names_the_file_and_the_fix(
        saved, tmp_path, damage, words):
    folder = copied(saved, tmp_path)
    damage(folder / WEIGHTS)
    with pytest.raises(ValueError, match=words) as exc:
        load_llama(folder)
    assert str(folder / WEIGHTS) in first_line(exc) and "save_pretrained" in first_line(exc)


def test_a_symlink_loop_names_the_file(saved, tmp_path):
    folder = copied(saved, tmp_path)
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).symlink_to(folder / WEIGHTS)
    with pytest.raises(FileNotFoundError, match="symlink that cannot be followed") as exc:
        load_llama(folder)
    assert str(folder / WEIGHTS) in first_line(exc)
    looped = tmp_path / "looped"
    looped.symlink_to(looped)  # the folder itself
    with pytest.raises(FileNotFoundError, match=f"{looped}: a symlink that cannot be"):
        load_llama(looped)


@pytest.mark.parametrize("text", ["[]", "{", "3"])
def test_a_config_json_that_is_not_an_object_names_the_file(saved, tmp_path, text):
    folder = copied(saved, tmp_path)
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match="config.json") as exc:
        load_llama(folder)
    assert str(folder / "config.json") in first_line(exc)
    assert "save_pretrained" in first_line(exc)


def test_an_integer_weight_is_refused_not_cast(saved, tmp_path):
    def to_int(tensors):
        tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    with pytest.raises(ValueError, match="tensor model.norm.weight is I32") as exc:
        load_llama(broken(saved, tmp_path, to_int))
    assert "cast" in first_line(exc)
    model = reduced()
    model.model.norm.weight = torch.nn.Parameter(  # no safetensors to read: the module
        torch.ones(64, dtype=torch.int32, device=DEVICE), requires_grad=False)
    with pytest.raises(TypeError, match="weight model.norm.weight is torch.int32"):
        load_llama(model)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_a_nan_or_inf_weight_is_refused_at_load_by_name(saved, tmp_path, bad):
    def poison(tensors):
        tensors["model.layers.1.self_attn.o_proj.weight"][3, 4] = bad
    with pytest.raises(ValueError, match="weight model.layers.1.self_attn.o_proj.weight "
                                         "holds NaN or infinite values"):
        load_llama(broken(saved, tmp_path, poison))


def test_a_gpu_that_is_not_there_is_refused_before_the_load(saved, monkeypatch):
    from transformers import LlamaForCausalLM

    def no_load(*args, **kwargs):
        raise AssertionError("loaded before the device was checked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(LlamaForCausalLM, "from_pretrained", no_load)
    with pytest.raises(ValueError, match="device='cuda': no CUDA GPU is visible"):
        load_llama(saved / "tied", device="cuda")
    with pytest.raises(ValueError, match="device='cuda:0': no CUDA GPU"):
        StaticDecoder(saved / "tied", 1, 16, device="cuda:0")
