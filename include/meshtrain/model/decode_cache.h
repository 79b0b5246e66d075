#pragma once
// One layer's cache for generation (model/generator.h), on this rank: its own header so that the
// generator (and train/'s samples through it) reach no block's sub-layers (model/block_attention.h
// fills it).

#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

// Standard attention: the keys and the values of its key/value heads, (KVH / tp, seq_len, HS)
// each. Latent attention: one tensor (1, seq_len, kv_lora_rank + qk_rope_head_dim) of the
// normalised latents and the rotated rotary keys, whole on every tensor rank, in `keys`
// (`values` empty): not the expanded keys and values (DeepSeek-V3: 576 elements per token and
// layer instead of 128 x 320).
struct DecodeCache {
  Tensor keys, values;
};

}  // namespace meshtrain
