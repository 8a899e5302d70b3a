"""flashattn inside other libraries: `flashattn.integrations.transformers.enable()` runs Hugging
Face transformers' own flash-attention code on flashattn (docs/transformers.md)."""
