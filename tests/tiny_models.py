"""Tiny random causal LMs and a word-level tokenizer built in code: no download, ever. (Needs the
models extra; imported lazily so that test modules that hold other tests import without it.)"""


def tiny_tokenizer(vocab_size=64):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1")


def tiny_model(seed=0, vocab_size=64, layers=2, positions=4096):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        eos_token_id=1,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so sampling is not uniform
        model.lm_head.weight.mul_(40.0)
    return model


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tokens(vocab_size=64):
    """A byte-level BPE vocabulary: 'Ġ' (space), the letters, merged pairs, and last the capitals A-D (the
    answer letters of multiple-choice prompts: the exact quality referee's tests)."""
    letters = [chr(ord("a") + i) for i in range(26)]
    pairs = [a + b for a in letters for b in letters]
    capitals = ["A", "B", "C", "D"]
    tokens = ["<s>", "</s>", "Ġ", *letters, *pairs][: vocab_size - len(capitals)] + capitals
    merges = [f"{t[0]} {t[1]}" for t in tokens if len(t) == 2 and t.isalpha()]
    return tokens, merges


def write_tiny_gguf(model, path, quantization=None):
    """Write a Qwen2 model (float32 tensors) and a tiny BPE tokenizer as a GGUF file with the gguf package;
    ``quantization="Q8_0"``: its matrices in llama.cpp's 8-bit blocks (gguf's own quantiser), so llama.cpp
    runs them through its quantised kernels, as it runs the real Q4_K_M pair."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or 10000.0))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(0 if quantization is None else int(getattr(gguf.LlamaFileType, f"MOSTLY_{quantization}")))
    tokens, merges = gguf_tokens(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(cfg.num_hidden_layers):
        for k, v in _LAYER_NAMES.items():
            names[f"model.layers.{i}.{k}"] = f"blk.{i}.{v}"
    qtype = None if quantization is None else getattr(gguf.GGMLQuantizationType, quantization)
    for k, v in model.state_dict().items():
        data = v.detach().float().numpy()
        if qtype is not None and data.ndim == 2:
            w.add_tensor(names[k], gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(names[k], data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
