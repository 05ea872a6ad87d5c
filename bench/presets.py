"""The configs of `kiln bench --preset` (src/llm/presets.cpp) in Hugging Face's config.json fields, for the
side-by-side scripts (torch_e2e.py, llama_cpp_cpu.py)."""

PRESETS = {
    "qwen3-0.6b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, rms_norm_eps=1e-6, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3-8b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rms_norm_eps=1e-6, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1000000.0, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048,
                          intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, rms_norm_eps=1e-6, vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1000000.0, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
    "llama-3-8b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       rms_norm_eps=1e-5, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                       tie_word_embeddings=False),
}
