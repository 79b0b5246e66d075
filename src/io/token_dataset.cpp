#include "meshtrain/io/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <stdexcept>
#include <thread>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

bool is_glob_pattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    throw DataError(pattern, "glob pattern matches no files");
  }
  if (rc != 0) throw DataError(pattern, "cannot expand glob pattern (read error)");
  // glob(3) sorts by the locale's collation; sort bytewise so the order (and with it every
  // sample index) is the same on every machine.
  std::sort(out.begin(), out.end());
  return out;
}

// "a.bin, b.bin, c.bin and 7 more": enough to find the files without flooding a log line.
std::string list_names(const std::vector<std::string>& names, size_t shown = 4) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += " and " + std::to_string(names.size() - shown) + " more";
  return s;
}

void check_seq_len(int64_t seq_len) {
  if (seq_len < 1) {
    throw std::invalid_argument("TokenDataset: seq_len = " + std::to_string(seq_len) +
                                " must be at least 1");
  }
}

}  // namespace

TokenDataset TokenDataset::from_shards(const std::vector<std::string>& paths, int64_t seq_len,
                                       const std::string& role) {
  check_seq_len(seq_len);
  if (paths.empty()) throw DataError("token dataset", "no shard paths given");
  TokenDataset d;
  d.seq_len_ = seq_len;
  for (const std::string& p : paths) {
    const std::vector<std::string> files =
        is_glob_pattern(p) ? expand_glob(p) : std::vector<std::string>{p};
    for (const std::string& f : files) {
      Source s;
      s.name = f;
      s.shard.emplace(TokenShard::open(f));
      s.tokens = s.shard->size();
      if (s.shard->vocab_size() > d.vocab_size_) {
        d.vocab_size_ = s.shard->vocab_size();
        d.largest_vocab_source_ = f;
      }
      d.sources_.push_back(std::move(s));
    }
  }
  d.finish(d.sources_.size() == 1 ? "shard" : "shards", role);
  return d;
}

TokenDataset TokenDataset::from_tokens(std::vector<uint32_t> tokens, uint32_t vocab_size,
                                       int64_t seq_len, std::string name,
                                       const std::string& role) {
  check_seq_len(seq_len);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw DataError(name, "token " + std::to_string(tokens[i]) + " at position " +
                                std::to_string(i) + " is not below vocab_size " +
                                std::to_string(vocab_size));
    }
  }
  TokenDataset d;
  d.seq_len_ = seq_len;
  d.vocab_size_ = vocab_size;
  d.largest_vocab_source_ = name;
  Source s;
  s.name = std::move(name);
  s.tokens = static_cast<int64_t>(tokens.size());
  s.memory = std::move(tokens);
  d.sources_.push_back(std::move(s));
  d.finish("in-memory source", role);
  return d;
}

void TokenDataset::finish(const std::string& kind, const std::string& role) {
  int64_t largest = 0;
  for (Source& s : sources_) {
    s.first_sample = samples_;
    s.samples = s.tokens > 0 ? (s.tokens - 1) / seq_len_ : 0;
    samples_ += s.samples;
    tokens_ += s.tokens;
    largest = std::max(largest, s.tokens);
  }
  std::vector<std::string> names;
  for (const Source& s : sources_) names.push_back(s.name);
  if (samples_ == 0) {
    throw DataError(list_names(names),
                    "no " + role + " samples: seq_len = " + std::to_string(seq_len_) +
                        " needs at least " + std::to_string(seq_len_ + 1) +
                        " tokens in one source, but the largest of " +
                        std::to_string(sources_.size()) + " holds " + std::to_string(largest) +
                        " (use a shorter seq_len or more data)");
  }
  description_ = std::to_string(sources_.size()) + " " + kind + " (" + list_names(names) + "), " +
                 std::to_string(tokens_) + " tokens, vocab " +
                 (vocab_size_ == 0 ? std::string("unknown (llm.c)") : std::to_string(vocab_size_)) + ", " +
                 std::to_string(samples_) + " samples of " + std::to_string(seq_len_) + "+1 tokens";
}

void TokenDataset::verify_shards(int worker, int workers, int threads,
                                 uint32_t model_vocab) const {
  if (workers < 1 || worker < 0 || worker >= workers)
    throw std::invalid_argument("TokenDataset::verify_shards: worker " + std::to_string(worker) +
                                " of " + std::to_string(workers));
  // Distinct files, largest first (ties in list order), each to the least-loaded worker.
  std::vector<size_t> order;
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (!sources_[i].shard) continue;
    const bool seen = std::any_of(order.begin(), order.end(),
                                  [&](size_t j) { return sources_[j].name == sources_[i].name; });
    if (!seen) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return sources_[a].tokens * sources_[a].shard->bytes_per_token() >
           sources_[b].tokens * sources_[b].shard->bytes_per_token();
  });
  std::vector<int64_t> load(static_cast<size_t>(workers), 0);
  std::vector<size_t> mine;
  for (size_t i : order) {
    const size_t w = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[w] += sources_[i].tokens * sources_[i].shard->bytes_per_token() + 1;
    if (static_cast<int>(w) == worker) mine.push_back(i);
  }
  std::sort(mine.begin(), mine.end());  // report the first bad shard in list order

  // Threads take the next shard from a shared counter; each records its shard's error.
  std::vector<std::exception_ptr> errors(mine.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < mine.size(); k = next++) {
      try {
        sources_[mine[k]].shard->verify(model_vocab);
      } catch (...) {
        errors[k] = std::current_exception();
      }
    }
  };
  const size_t n_threads = std::min(mine.size(), static_cast<size_t>(std::max(1, threads)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

void TokenDataset::sample(int64_t index, int32_t* inputs, int32_t* targets) const {
  if (index < 0 || index >= samples_) {
    throw std::out_of_range("TokenDataset: sample " + std::to_string(index) + " out of range [0, " +
                            std::to_string(samples_) + ")");
  }
  // The last source whose first sample is <= index; sources with no windows are skipped
  // naturally because the next source has the same first_sample.
  auto it = std::upper_bound(sources_.begin(), sources_.end(), index,
                             [](int64_t i, const Source& s) { return i < s.first_sample; });
  const Source& s = *std::prev(it);
  const int64_t start = (index - s.first_sample) * seq_len_;
  if (s.shard) {
    s.shard->read(start, seq_len_, inputs);
    s.shard->read(start + 1, seq_len_, targets);
  } else {
    const uint32_t* t = s.memory.data() + start;
    for (int64_t i = 0; i < seq_len_; ++i) {
      inputs[i] = static_cast<int32_t>(t[i]);
      targets[i] = static_cast<int32_t>(t[i + 1]);
    }
  }
}

}  // namespace meshtrain
