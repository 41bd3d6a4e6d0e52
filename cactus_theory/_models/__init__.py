"""Real models, the only wing that imports torch and transformers: loading (Hugging Face ids,
directories, GGUF files), dumping traces, speculative decoding, calibrating costs, importing
logits files. Imports every wing below it."""
