// Prompts for generation (train/text_sample.h): encoded with the run's tokenizer and refused,
// with the key and the limit, where the model cannot take them; the layouts that can generate.

#include <gtest/gtest.h>

#include <string>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/train/text_sample.h"

namespace meshtrain {
namespace {

std::string error_of(const Tokenizer& tok, const std::string& prompt, const ModelSpec& cfg) {
  try {
    encode_prompt(tok, prompt, cfg, "--prompt", nullptr);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "";
}

TEST(TextSample, Prompts) {
  const auto tok = make_byte_tokenizer();
  ModelSpec cfg;
  cfg.vocab_size = 100;
  cfg.seq_len = 8;
  bool implicit = false;
  EXPECT_EQ(encode_prompt(*tok, "ab", cfg, "--prompt", &implicit), (std::vector<int32_t>{97, 98}));
  EXPECT_FALSE(implicit);
  // An empty prompt starts from the line break, marked implicit (not printed).
  EXPECT_EQ(encode_prompt(*tok, "", cfg, "--prompt", &implicit), (std::vector<int32_t>{10}));
  EXPECT_TRUE(implicit);
  // UTF-8 bytes 0xC3 0xA9 are not below a vocabulary of 100.
  EXPECT_NE(error_of(*tok, "a\xC3\xA9", cfg).find("token 1 of the prompt has id 195, not below "
                                                  "model.vocab_size = 100"),
            std::string::npos);
  EXPECT_NE(error_of(*tok, "123456789", cfg).find("the prompt is 9 tokens, longer than "
                                                  "model.seq_len = 8"),
            std::string::npos);
  EXPECT_EQ(error_of(*tok, "12345678", cfg), "");
  cfg.vocab_size = 5;  // no line break in the vocabulary: start from id 0
  EXPECT_EQ(start_token(*tok, cfg.vocab_size), 0);
  EXPECT_EQ(decode_tokens(*tok, {104, 105}), "hi");
  // A model padded past its tokenizer (GPT-2's 50304 rows for 50257 tokens) may generate an id
  // the tokenizer lacks: shown by number, never an error that would end a training run's sample.
  EXPECT_EQ(decode_tokens(*tok, {104, 300, 105, 256}), "h<|id:300|>i<|id:256|>");
}

TEST(TextSample, Layouts) {
  Config c;
  c.run.device = DeviceChoice::Cpu;  // not used here; the device check wants every Config pinned
  EXPECT_EQ(generation_unsupported(c), "");
  c.parallel.tp = 2;
  c.parallel.zero = 2;
  EXPECT_EQ(generation_unsupported(c), "");
  c.parallel.sequence_parallel = true;
  EXPECT_EQ(generation_unsupported(c), "");
  c.parallel.zero = 3;
  EXPECT_NE(generation_unsupported(c).find("zero = 3"), std::string::npos);
  c.parallel.zero = 0;
  c.parallel.pp = 2;
  EXPECT_EQ(generation_unsupported(c), "");
  // Latent attention generates from its cache of compressed latents (model/latent_attention.h).
  c.model.attention = AttentionKind::Latent;
  EXPECT_EQ(generation_unsupported(c), "");
}

}  // namespace
}  // namespace meshtrain
