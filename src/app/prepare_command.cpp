#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/docs_page.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/jsonl_documents.h"
#include "meshtrain/io/prepare.h"
#include "meshtrain/io/prepare_outputs.h"
#include "meshtrain/io/sentencepiece_tokenizer.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/train/data_feed.h"

namespace meshtrain {

namespace {

// "bpe:8000" -> (Bpe, 8000); anything else is a usage error saying what is accepted.
std::pair<SubwordModel, uint32_t> parse_training_spec(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string usage = "--train-tokenizer " + spec +
                            ": expected bpe:N or unigram:N, N the vocabulary size (e.g. bpe:8000; "
                            "at least 300: 256 byte pieces, 3 specials and the text's characters)";
  if (colon == std::string::npos || (kind != "bpe" && kind != "unigram"))
    throw std::invalid_argument(usage);
  const std::string n = spec.substr(colon + 1);
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(n, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument(usage);
  }
  if (used != n.size() || n.empty() || n[0] == '-' || v < 1)
    throw std::invalid_argument(usage);
  // SentencePiece keeps piece ids in int; a shard's vocab_size field is a uint32.
  if (v > 0x7FFFFFFFull)
    throw std::invalid_argument("--train-tokenizer " + spec + ": a vocabulary of " + n +
                                " pieces is more than a token id holds (at most 2^31 - 1; "
                                "GPT-2 has 50257, LLaMA 3 128256)");
  return {kind == "bpe" ? SubwordModel::Bpe : SubwordModel::Unigram, static_cast<uint32_t>(v)};
}

// The files --tokenizer names ("a.json,b.txt", a file, the files of a directory): what no output
// may replace. "bytes" and a name that is not a path (e.g. "gpt2") name none.
std::vector<std::string> tokenizer_files(const std::string& spec) {
  std::vector<std::string> files;
  for (size_t begin = 0; begin <= spec.size();) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::filesystem::path part = spec.substr(begin, comma - begin);
    std::error_code ec;
    if (std::filesystem::is_directory(part, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(part, ec))
        files.push_back(entry.path().string());
    } else if (!part.empty()) {
      files.push_back(part.string());
    }
    begin = comma + 1;
  }
  return files;
}

// --train-tokenizer: a SentencePiece model trained on the text files, after the outputs were
// checked (the training can take an hour, as before the tokenizing).
std::unique_ptr<Tokenizer> train_tokenizer_first(const PrepareArgs& args, ExistingOutputs existing,
                                                 int threads) {
  const auto [model, vocab] = parse_training_spec(args.train_tokenizer);
  // SentencePiece's trainer reads its files as lines of text: it would learn JSON.
  for (const std::string& path : args.inputs)
    if (is_jsonl_path(path))
      throw std::invalid_argument(
          "--train-tokenizer trains on text files, and " + path + " is JSON Lines (train "
          "the tokenizer on text files, or give one with --tokenizer)");
  check_prepare_outputs(prepare_output_names(args.out_prefix, args.val_fraction, ".model"), args.inputs,
                        existing);
  for (const std::string& path : args.inputs) check_text_file(path);
  std::fprintf(stderr, "prepare: training a %s tokenizer of %u pieces on %d thread(s)\n",
               args.train_tokenizer.substr(0, args.train_tokenizer.find(':')).c_str(), vocab, threads);
  return train_sentencepiece(args.inputs, model, vocab, threads);
}

// The options of the tokenizing, the end-of-text token refused where the tokenizer has none.
PrepareOptions prepare_options(const PrepareArgs& args, const Tokenizer& tok, int threads,
                               ExistingOutputs existing) {
  PrepareOptions opt;
  opt.val_fraction = args.val_fraction;
  opt.threads = threads;
  opt.progress = true;
  opt.text_field = args.text_field;
  opt.max_bad_lines = args.max_bad_lines;
  opt.max_line_bytes = static_cast<uint64_t>(args.max_line_bytes);
  opt.existing = existing;
  opt.tokenizer_files = tokenizer_files(args.tokenizer);
  if (args.end_of_text) {
    opt.end_of_text = tok.end_of_text();
    if (!opt.end_of_text)
      throw std::invalid_argument(
          "--end-of-text: the " + tok.kind() + " tokenizer" +
          (args.train_tokenizer.empty() && args.tokenizer != "bytes" ? " " + args.tokenizer
                                                                      : std::string()) +
          " has no end-of-text token (GPT-2's, Llama 3's and Qwen's tokenizer.json have one, "
          "as does a SentencePiece model with </s>; the byte tokenizer has none)");
  }
  return opt;
}

// What was written, and what the deck needs to train on these shards.
void print_prepared(const PrepareArgs& args, const PrepareResult& r, const Tokenizer* tok) {
  if (!r.val_path.empty()) {
    std::printf("wrote %s (%lld tokens) and %s (%lld tokens)\n", r.train_path.c_str(),
                static_cast<long long>(r.train_tokens), r.val_path.c_str(),
                static_cast<long long>(r.val_tokens));
  } else {
    std::printf("wrote %s (%lld tokens); no validation shard (--val-fraction 0): train with "
                "data.val = \"none\" or another validation shard\n",
                r.train_path.c_str(), static_cast<long long>(r.train_tokens));
    // A validation shard of an earlier run is not this text's: say so rather than delete it.
    const std::string stale = args.out_prefix + "_val.bin";
    std::error_code ec;
    if (std::filesystem::exists(stale, ec))
      std::fprintf(stderr, "meshtrain: warning: %s is left from an earlier prepare and does "
                   "not match %s\n", stale.c_str(), r.train_path.c_str());
  }
  if (tok && !r.tokenizer_path.empty()) {
    std::printf("tokenizer %s (%s, %u tokens); in the deck:\n  data.tokenizer = \"%s\"\n"
                "  model.vocab_size = %u\n",
                r.tokenizer_path.c_str(), tok->kind().c_str(), r.vocab_size,
                r.tokenizer_path.c_str(), r.vocab_size);
  } else {
    std::printf("byte-level tokens; in the deck:\n  data.tokenizer = \"bytes\"\n"
                "  model.vocab_size = 256\n");
  }
}

}  // namespace

int prepare_command(const PrepareArgs& args) {
  try {
    const int threads = args.threads > 0 ? args.threads : available_cores();
    const ExistingOutputs existing = args.force ? ExistingOutputs::Replace : ExistingOutputs::Refuse;
    PrepareResult r;
    std::unique_ptr<Tokenizer> tok;
    if (args.synthetic_bytes > 0) {
      if (args.tokenizer != "bytes" || !args.train_tokenizer.empty() || args.end_of_text)
        throw std::invalid_argument("prepare --synthetic writes byte-level shards; it takes no "
                                    "--tokenizer, --train-tokenizer or --end-of-text");
      r = prepare_synthetic(kSyntheticTrainSeed, static_cast<size_t>(args.synthetic_bytes),
                            args.out_prefix, args.val_fraction, existing);
    } else {
      tok = args.train_tokenizer.empty() ? open_tokenizer(args.tokenizer)
                                         : train_tokenizer_first(args, existing, threads);
      const PrepareOptions opt = prepare_options(args, *tok, threads, existing);
      r = prepare_text_files(args.inputs, args.out_prefix, *tok, opt);
    }
    print_prepared(args, r, tok.get());
    return kExitOk;
  } catch (const DataError& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    print_docs_pointer(e.what(), "docs/data-and-interop.md");
    return kExitInput;
  } catch (const std::invalid_argument& e) {  // arguments main() could not check
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    print_docs_pointer(e.what(), "docs/data-and-interop.md");
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: internal error: %s\n", e.what());
    return kExitInternal;
  }
}

}  // namespace meshtrain
