"""Hugging Face transformers on flashattn (flashattn.integrations.transformers): tiny
random-weight models built from configs (no downloads) with attn_implementation
"flash_attention_2" and flashattn's own name, against transformers' "sdpa" and "eager" on the
same weights: Llama with GQA, Mistral with a sliding window, Gemma 2 with softcap, gpt-oss with
attention sinks, DeepSeek-V2's MLA (Q/K head dim 192, V head dim 128). fp32 logits within 1e-5
of max |reference|; bf16 logits within twice eager-vs-sdpa's own difference; left-padded
batches; packed sequences against each sequence alone; greedy generation of 32 tokens with
dynamic and static caches identical; one training step's gradients. Weights are drawn with
std 0.2 (not 0.02) so that the scores spread and softcap and windows change the result.
Skipped, with the reason, where torch, transformers or kernels is missing (`make test-torch`
installs them)."""

import importlib.util
import inspect
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
for _pkg in ("transformers", "kernels"):
    if importlib.util.find_spec(_pkg) is None:
        pytest.skip(f"{_pkg} is not installed (make test-torch installs transformers and "
                    f"kernels)", allow_module_level=True)

import transformers  # noqa: E402

import flashattn  # noqa: E402
import flashattn.integrations.transformers as fa_tf  # noqa: E402
from helpers import seeded  # noqa: E402

transformers.logging.set_verbosity_error()
FA = ("flash_attention_2", fa_tf.NAME)
VOCAB, B, S, NEW = 64, 2, 16, 32


def _common(**kw):
    return dict(dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=128, initializer_range=0.2, pad_token_id=0,
                     bos_token_id=1, eos_token_id=None, tie_word_embeddings=False), **kw)


CONFIGS = {
    "llama_gqa": lambda: transformers.LlamaConfig(**_common()),
    "mistral_window": lambda: transformers.MistralConfig(**_common(sliding_window=5)),
    "gemma2_softcap": lambda: transformers.Gemma2Config(**_common(
        head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
        final_logit_softcapping=None, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"])),
    "gptoss_sinks": lambda: transformers.GptOssConfig(**_common(
        head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"])),
    "deepseek_v2_mla": lambda: transformers.DeepseekV2Config(**_common(
        first_k_dense_replace=2, q_lora_rank=None, kv_lora_rank=16,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_key_value_heads=4)),
}


@pytest.fixture(scope="module", autouse=True)
def enabled():
    """enable() warns only outside the tested versions: here they are the tested ones."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        fa_tf.enable()
    assert not [str(w.message) for w in log if "flashattn" in str(w.message)]


def _model(name, key, dtype=torch.float32):
    torch.manual_seed(seeded(f"{name}:{key}") % 2 ** 63)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name](),
                                                          attn_implementation="eager")
    if name == "gptoss_sinks":  # sinks start at 0: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return model.to(dtype).eval()


def _inputs(name, key, left_pad=True):
    g = torch.Generator().manual_seed(seeded(f"{name}:{key}:ids") % 2 ** 63)
    ids = torch.randint(2, VOCAB, (B, S), generator=g)
    mask = torch.ones_like(ids)
    if left_pad:
        mask[0, :5] = 0
        ids[0, :5] = 0
    return ids, mask


def _logits(model, impl, ids, mask=None, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kw).logits.float()


def _refs(model):
    """transformers' own implementations for model: sdpa (where it has it: not Gemma 2's
    softcap, not gpt-oss's sinks) and eager."""
    return ("sdpa", "eager") if model._supports_sdpa else ("eager",)


def _rel(a, ref, where=None):
    if where is not None:
        a, ref = a[where], ref[where]
    return float((a - ref).abs().max() / ref.abs().max())


def _called(monkeypatch):
    """Counts the calls that reach flashattn, so that a test fails if transformers never did."""
    calls = {"n": 0}
    for fn in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        orig = getattr(fa_tf._fai, fn)

        def counted(*a, _orig=orig, **k):
            calls["n"] += 1
            return _orig(*a, **k)

        counted.__signature__ = inspect.signature(orig)
        counted.__name__ = orig.__name__
        monkeypatch.setattr(fa_tf._fai, fn, counted)
    return calls


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "left_padded"])
def test_logits_fp32(name, padded, monkeypatch):
    calls = _called(monkeypatch)
    model = _model(name, "fp32")
    ids, mask = _inputs(name, "fp32", left_pad=padded)
    valid = mask.bool()
    refs = {impl: _logits(model, impl, ids, mask if padded else None) for impl in _refs(model)}
    for impl in FA:
        out = _logits(model, impl, ids, mask if padded else None)
        for ref_impl, ref in refs.items():
            err = _rel(out, ref, valid)
            assert err <= 1e-5, f"{impl} vs {ref_impl}: rel err {err:.2e}"
    assert calls["n"] >= 2 * model.config.num_hidden_layers


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_bf16(name):
    model = _model(name, "bf16", torch.bfloat16)
    ids, mask = _inputs(name, "bf16")
    valid = mask.bool()
    ref = _logits(_model(name, "bf16"), "eager", ids, mask)  # the same weights in fp32
    eager = _logits(model, "eager", ids, mask)
    bound_fp32 = 2 * _rel(eager, ref, valid)
    bound = 2 * _rel(eager, _logits(model, "sdpa", ids, mask), valid) \
        if model._supports_sdpa else None
    assert bound_fp32 > 0 and bound != 0
    for impl in FA:
        out = _logits(model, impl, ids, mask)
        # no further from fp32 eager than bf16 eager is, twice
        err = _rel(out, ref, valid)
        assert err <= bound_fp32, f"bf16 {impl} vs fp32: {err:.2e} > 2 x bf16 eager's"
        if bound is not None:
            err = _rel(out, eager, valid)
            assert err <= bound, f"bf16 {impl} vs eager: {err:.2e} > 2 x eager-vs-sdpa"


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation(name, cache, monkeypatch):
    """32 new tokens for a left-padded batch, identical to transformers' own (sdpa where the
    model has it, else eager); flash_attention_2 with a dynamic cache, NAME with a static one
    (the same code in transformers, one generation each to keep the file fast)."""
    model = _model(name, "gen")
    ids, mask = _inputs(name, "gen")
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    if cache == "static":
        kw["cache_implementation"] = "static"
    tokens = {}
    for impl in (_refs(model)[0], FA[cache == "static"]):
        model.set_attn_implementation(impl)
        calls = _called(monkeypatch)
        tokens[impl] = model.generate(input_ids=ids, attention_mask=mask, **kw)
        assert tokens[impl].shape == (B, S + NEW)
        if impl in FA:
            assert calls["n"] >= NEW * model.config.num_hidden_layers
    ref, fa = tokens.values()
    assert torch.equal(fa, ref), f"{list(tokens)}: {fa} vs {ref}"


def _grads(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    model.train()
    model.zero_grad(set_to_none=True)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:][mask[:, :-1] == 0] = -100  # nothing predicted from a padding position
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", CONFIGS)
def test_training_step_gradients(name):
    model = _model(name, "train")
    ids, mask = _inputs(name, "train")
    refs = {impl: _grads(model, impl, ids, mask) for impl in _refs(model)}
    ref = refs["eager"]
    scale = max(float(g.abs().max()) for g in ref.values())
    for impl in FA:
        got = _grads(model, impl, ids, mask)
        assert got.keys() == ref.keys()
        for n, g in got.items():
            for ref_impl, r in refs.items():
                err = float((g - r[n]).abs().max()) / scale
                assert err <= 1e-5, f"{impl} vs {ref_impl}: d{n} rel err {err:.2e}"


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_window"])
def test_packed_sequences(name, monkeypatch):
    """Two sequences packed in one row (position_ids restart): transformers' varlen path, each
    sequence's logits as when run alone through sdpa."""
    model = _model(name, "packed")
    ids, _ = _inputs(name, "packed", left_pad=False)
    lens = (7, S - 7)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    alone = [_logits(model, "sdpa", part) for part in torch.split(ids[:1], lens, dim=1)]
    ref = torch.cat(alone, dim=1)
    for impl in FA:
        calls = _called(monkeypatch)
        out = _logits(model, impl, ids[:1], None, position_ids=pos)
        assert calls["n"] == model.config.num_hidden_layers
        assert _rel(out, ref) <= 1e-5, impl


def test_sinks_reach_flashattn(monkeypatch):
    """gpt-oss's sinks arrive as learnable_sink (not dropped): its (H,) parameter, each layer's."""
    seen = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        orig = getattr(fa_tf._fai, name)

        def spy(*args, _orig=orig, **kw):
            seen.append(kw.get("learnable_sink"))
            return _orig(*args, **kw)

        monkeypatch.setattr(fa_tf._fai, name, spy)
    model = _model("gptoss_sinks", "spy")
    ids, mask = _inputs("gptoss_sinks", "spy")
    _logits(model, "flash_attention_2", ids, mask)
    assert seen and seen[0] is not None
    assert torch.equal(seen[0].float(), model.model.layers[0].self_attn.sinks.float())


def test_enable_is_idempotent_and_refuses_conflicts(monkeypatch):
    before = os.environ["LOCAL_KERNELS"]
    assert fa_tf.enable() == fa_tf.NAME
    assert os.environ["LOCAL_KERNELS"] == before
    entries = dict(e.split("=", 1) for e in before.split(":"))
    assert entries[fa_tf.NAME] == str(fa_tf.KERNEL_DIR)
    assert entries["kernels-community/flash-attn2"] == str(fa_tf.KERNEL_DIR)
    monkeypatch.setenv("LOCAL_KERNELS", f"{fa_tf.NAME}=/elsewhere")
    with pytest.raises(flashattn.FlashAttnValueError, match="already maps"):
        fa_tf.enable()


def test_unsupported_call_raises_flashattn_error():
    """What flashattn cannot do raises its error through transformers (head dim 512 here)."""
    cfg = transformers.LlamaConfig(**_common(head_dim=512))
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=fa_tf.NAME)
    ids, mask = _inputs("llama_gqa", "big")
    with pytest.raises(flashattn.FlashAttnError):
        model(input_ids=ids, attention_mask=mask)
