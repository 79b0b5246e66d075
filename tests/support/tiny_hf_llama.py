#!/usr/bin/env python3
"""Writes a tiny Hugging Face Llama 3 directory, as `huggingface-cli download --local-dir` leaves
one: config.json (LlamaForCausalLM, grouped-query attention, Llama 3 rope_scaling, tied),
model.safetensors of random weights in HF's layout, and a byte-level BPE tokenizer.json whose
post-processor starts every text with <|begin_of_text|> (256) and whose <|end_of_text|> (257)
ends documents, with its tokenizer_config.json. examples_test puts it where the README's
"Fine-tune a Hugging Face model" walk-through names a downloaded Llama-3.2-1B.

usage: tiny_hf_llama.py DIR
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "checkpoint"))
import hf_llama_test as hf  # noqa: E402  (its writers: the format from its specification)


def write(directory):
    config = dict(hf.LLAMA, bos_token_id=256, eos_token_id=257)
    hf.write_hf_dir(directory, config, hf.random_weights(config, "F32", seed=3), "F32")
    hf.write_tokenizer(directory)
    path = os.path.join(directory, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [256],
                                                 "tokens": ["<|begin_of_text|>"]}}}
    with open(path, "w") as f:
        json.dump(tokenizer, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write(sys.argv[1])
